// tests/comm/communicator_test.cpp: cairn/comm/communicator.hpp: which types model communicator
// and scalable_communicator, comm_ref forwarding every call to the communicator it refers to
// (non-owning, copies share it), and the gather / all_to_all comm_ref builds from all_gather
// when a communicator lacks them: their wire packing, seen from one rank of four, and refusal
// of a truncated or lying peer message. (Every collective on real worlds, fallbacks included,
// is in conformance_test.cpp.)
#include "cairn/comm/communicator.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/single.hpp"
#include "cairn/comm/threads.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/message.hpp"

namespace communicator_test {

inline cairn::bytes text(const std::string& s) {
  auto b = std::as_bytes(std::span(s));
  return {b.begin(), b.end()};
}

/// Rank 2 of 4, with the base collectives only. all_gather returns `peers` with this rank's
/// input in slot 2, and every call is logged.
struct recording {
  std::vector<cairn::bytes> peers = std::vector<cairn::bytes>(4);
  std::vector<std::string> log;
  int rank() const { return 2; }
  int size() const { return 4; }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
    log.push_back("all_gather " + std::to_string(in.size()));
    auto out = peers;
    out[2].assign(in.begin(), in.end());
    return out;
  }
  void broadcast(cairn::bytes& b, int root) {
    log.push_back("broadcast " + std::to_string(root));
    b = text("from root");
  }
  void barrier() { log.push_back("barrier"); }
};

/// `recording` with native gather and all_to_all.
struct recording_scalable : recording {
  std::vector<cairn::bytes> gather(std::span<const std::byte>, int root) {
    log.push_back("gather " + std::to_string(root));
    return {};
  }
  std::vector<cairn::bytes> all_to_all(const std::vector<cairn::bytes>& to) {
    log.push_back("all_to_all " + std::to_string(to.size()));
    return to;
  }
};

struct no_barrier {
  int rank() const { return 0; }
  int size() const { return 1; }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte>) { return {}; }
  void broadcast(cairn::bytes&, int) {}
};

struct wrong_gather_type : recording {
  std::vector<std::string> gather(std::span<const std::byte>, int) { return {}; }
  std::vector<cairn::bytes> all_to_all(const std::vector<cairn::bytes>& to) { return to; }
};

/// What `all_to_all_by_all_gather` sends: every message, in rank order.
inline cairn::bytes packed(const std::vector<std::string>& msgs) {
  std::vector<cairn::bytes> all;
  for (const auto& m : msgs) all.push_back(text(m));
  return cairn::detail::encode_message(all);
}

}  // namespace communicator_test

TEST_CASE("the concepts accept the base collectives, and the scalable ones on top") {
  static_assert(cairn::communicator<communicator_test::recording>);
  static_assert(!cairn::scalable_communicator<communicator_test::recording>);
  static_assert(cairn::scalable_communicator<communicator_test::recording_scalable>);
  static_assert(!cairn::communicator<communicator_test::no_barrier>);
  static_assert(cairn::communicator<communicator_test::wrong_gather_type>);
  static_assert(!cairn::scalable_communicator<communicator_test::wrong_gather_type>);
  static_assert(cairn::scalable_communicator<cairn::single_communicator>);
  static_assert(cairn::scalable_communicator<cairn::thread_communicator>);
  static_assert(cairn::scalable_communicator<cairn::comm_ref>);  // it offers both, always
}

TEST_CASE("comm_ref forwards every call to the communicator it refers to") {
  communicator_test::recording_scalable c;
  c.peers = {communicator_test::text("a"), {}, {}, communicator_test::text("dd")};
  cairn::comm_ref ref(c);
  CHECK(ref.rank() == 2);
  CHECK(ref.size() == 4);
  CHECK(ref.scalable());
  auto all = ref.all_gather(communicator_test::text("mine"));
  CHECK(all == std::vector<cairn::bytes>{communicator_test::text("a"),
                                         {},
                                         communicator_test::text("mine"),
                                         communicator_test::text("dd")});
  cairn::bytes b;
  ref.broadcast(b, 3);
  CHECK(b == communicator_test::text("from root"));
  ref.barrier();
  (void)ref.gather({}, 1);
  (void)ref.all_to_all(std::vector<cairn::bytes>(4));
  const cairn::comm_ref copy = ref;  // a copy refers to the same communicator
  copy.barrier();
  CHECK(c.log == std::vector<std::string>{"all_gather 4", "broadcast 3", "barrier", "gather 1",
                                          "all_to_all 4", "barrier"});
}

TEST_CASE("without native gather, comm_ref gathers by all_gather on every rank") {
  communicator_test::recording c;
  c.peers = {communicator_test::text("r0"),
             communicator_test::text("r1"),
             {},
             communicator_test::text("r3")};
  cairn::comm_ref ref(c);
  CHECK_FALSE(ref.scalable());
  auto at_root = ref.gather(communicator_test::text("r2"), 2);
  CHECK(at_root ==
        std::vector<cairn::bytes>{communicator_test::text("r0"), communicator_test::text("r1"),
                                  communicator_test::text("r2"), communicator_test::text("r3")});
  auto elsewhere = ref.gather(communicator_test::text("r2"), 0);
  CHECK(elsewhere.empty());
  // Not the root, but it still took part in the collective.
  CHECK(c.log == std::vector<std::string>{"all_gather 2", "all_gather 2"});
}

TEST_CASE("without native all_to_all, comm_ref keeps the message each rank addressed to it") {
  communicator_test::recording c;
  // What ranks 0, 1 and 3 sent: message d of each goes to rank d; this is rank 2.
  c.peers = {communicator_test::packed({"0>0", "0>1", "0>2", "0>3"}),
             communicator_test::packed({"", "", "", ""}),
             {},
             communicator_test::packed({"3>0", "3>1", "3>2 is longer", ""})};
  cairn::comm_ref ref(c);
  std::vector<cairn::bytes> to{communicator_test::text("2>0"),
                               {},
                               communicator_test::text("2>2"),
                               communicator_test::text("2>3")};
  auto got = ref.all_to_all(to);
  CHECK(got == std::vector<cairn::bytes>{communicator_test::text("0>2"),
                                         {},
                                         communicator_test::text("2>2"),
                                         communicator_test::text("3>2 is longer")});
  CHECK(c.log.size() == 1);  // one all_gather

  // One buffer per rank, or an error on this rank, after the collective the others are in.
  to.pop_back();
  try {
    (void)ref.all_to_all(to);
    FAIL("all_to_all with 3 buffers on 4 ranks returned");
  } catch (const cairn::exception& e) {
    CHECK(e.err().code == cairn::errc::invalid_argument);
    CHECK(e.err().message.find("one buffer per rank (4), got 3") != std::string::npos);
  }
  CHECK(c.log.size() == 2);
}

TEST_CASE("a truncated or lying peer message in the all_to_all fallback is a comm error") {
  communicator_test::recording c;
  cairn::detail::message_writer lying;
  lying.count(std::size_t{1} << 62);  // claims 2^62 messages follow
  cairn::bytes cut = communicator_test::packed({"0>0", "0>1", "0>2", "0>3"});
  cut.resize(cut.size() - 13);  // ends inside message 2 (message 3 takes 11 bytes)
  const cairn::bytes three = communicator_test::packed({"a", "b", "c"});  // one rank short
  for (const cairn::bytes& bad : {cairn::bytes{}, cairn::bytes(5), cut, lying.data(), three}) {
    CAPTURE(bad.size());
    c.peers = std::vector<cairn::bytes>(4, communicator_test::packed({"a", "b", "c", "d"}));
    c.peers[0] = bad;
    cairn::comm_ref ref(c);
    try {
      (void)ref.all_to_all(std::vector<cairn::bytes>(4));
      FAIL_CHECK("no exception");
    } catch (const cairn::exception& e) {
      CHECK(e.err().code == cairn::errc::comm);
      CHECK(e.err().message.find("malformed all_to_all between ranks") == 0);
      CHECK(e.err().rank == 0);
    }
  }
}
