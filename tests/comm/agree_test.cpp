// tests/comm/agree_test.cpp: cairn/comm/agree.hpp: rank_statuses::first_failure, and the three
// agreement collectives on thread ranks: agree (every rank learns every status and payload,
// every error field intact), announce (root's outcome, tagged with root), agree_at_root (decide
// runs on root only, sees every payload; a failing rank or a throwing decide becomes the verdict
// on every rank), and a malformed status from a peer.
#include "cairn/comm/agree.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cairn/comm/single.hpp"
#include "cairn/comm/threads.hpp"
#include "cairn/core/error.hpp"
#include "tests/support/message_check.hpp"

namespace agree_test {

inline cairn::bytes text(const std::string& s) {
  auto b = std::as_bytes(std::span(s));
  return {b.begin(), b.end()};
}

/// An error with every field set, distinct per rank.
inline cairn::error full_error(int r) {
  auto e = cairn::make_error(cairn::errc::corrupt, "bad block on rank " + std::to_string(r));
  e.key = "w" + std::to_string(r);
  e.file = "__" + std::to_string(r) + "_0.distcp";
  e.offset = 0;  // a known offset of 0 must survive
  return e;
}

/// Rank 0 of 2 whose peer sends `peer` in every all_gather.
struct peer_sends {
  cairn::bytes peer;
  int rank() const { return 0; }
  int size() const { return 2; }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
    return {cairn::bytes(in.begin(), in.end()), peer};
  }
  void broadcast(cairn::bytes&, int) {}
  void barrier() {}
};

}  // namespace agree_test

TEST_CASE("first_failure is the lowest failing rank's error, tagged with that rank") {
  cairn::rank_statuses s;
  s.status = {std::nullopt, std::nullopt, std::nullopt};
  CHECK_FALSE(s.first_failure().has_value());
  s.status[2] = cairn::make_error(cairn::errc::io, "disk full");
  s.status[1] = cairn::make_error(cairn::errc::mismatch, "dtype");
  auto f = s.first_failure();
  REQUIRE(f.has_value());
  CHECK(f->message == "dtype");
  CHECK(f->rank == 1);
  CHECK(s.status[1]->rank == -1);  // the statuses themselves are not modified
  // A rank the error already names (a failure reported on behalf of another) is kept.
  s.status[1]->rank = 7;
  CHECK(s.first_failure()->rank == 7);
  CHECK_FALSE(cairn::rank_statuses{}.first_failure().has_value());
}

TEST_CASE("agree gives every rank every status and payload, every field intact") {
  auto got = cairn::run_ranks_collect(3, [](cairn::thread_communicator& c) {
    std::optional<cairn::error> mine;
    if (c.rank() != 0) mine = agree_test::full_error(c.rank());
    cairn::bytes payload = agree_test::text(std::string(static_cast<std::size_t>(c.rank()), 'p'));
    return cairn::agree(c, mine, payload);
  });
  for (const auto& s : got) {
    REQUIRE(s.status.size() == 3);
    REQUIRE(s.payloads.size() == 3);
    CHECK_FALSE(s.status[0].has_value());
    for (int r = 1; r < 3; ++r) {
      const auto& e = s.status[static_cast<std::size_t>(r)];
      REQUIRE(e.has_value());
      auto want = agree_test::full_error(r);
      CHECK(e->code == want.code);
      CHECK(e->message == want.message);
      CHECK(e->key == want.key);
      CHECK(e->rank == -1);  // agree reports, the caller decides what to tag
      CHECK(e->file == want.file);
      CHECK(e->offset == std::optional<std::uint64_t>(0));
    }
    CHECK(s.payloads[0].empty());
    CHECK(s.payloads[2] == agree_test::text("pp"));
    auto f = s.first_failure();
    REQUIRE(f.has_value());
    CHECK(f->describe() ==
          "corrupt: bad block on rank 1 [key=w1 rank=1 file=__1_0.distcp offset=0]");
  }
}

TEST_CASE("announce tells every rank root's outcome and ignores the others'") {
  auto got = cairn::run_ranks_collect(3, [](cairn::thread_communicator& c) {
    std::optional<cairn::error> mine =
        cairn::make_error(cairn::errc::io, "status of rank " + std::to_string(c.rank()));
    auto [ok_status, ok_payload] =
        cairn::announce(c, 1, std::nullopt, agree_test::text("r" + std::to_string(c.rank())));
    auto [bad_status, bad_payload] = cairn::announce(c, 2, mine);
    auto e = bad_status.value_or(cairn::error{});
    return std::to_string(ok_status.has_value()) + " " +
           std::string(reinterpret_cast<const char*>(ok_payload.data()), ok_payload.size()) +
           " | " + e.message + " rank=" + std::to_string(e.rank) + " payload " +
           std::to_string(bad_payload.size());
  });
  for (const auto& s : got) CHECK(s == "0 r1 | status of rank 2 rank=2 payload 0");

  // A status that already names a rank keeps it.
  cairn::single_communicator one;
  auto [st, pl] = cairn::announce(one, 0, cairn::make_error(cairn::errc::comm, "x").with_rank(5));
  CHECK(st->rank == 5);
  CHECK(pl.empty());
}

TEST_CASE("agree_at_root decides on root from every payload and tells every rank") {
  std::atomic<int> decisions{0};
  auto got = cairn::run_ranks_collect(4, [&](cairn::thread_communicator& c) {
    auto [status, verdict] = cairn::agree_at_root(
        c, 3, std::nullopt, agree_test::text(std::to_string(c.rank() * 10)),
        [&](const std::vector<cairn::bytes>& payloads) {
          decisions.fetch_add(1);
          std::string joined;
          for (const auto& p : payloads)
            joined += std::string(reinterpret_cast<const char*>(p.data()), p.size()) + ",";
          return std::pair{std::optional<cairn::error>{}, agree_test::text(joined)};
        });
    CHECK_FALSE(status.has_value());
    return std::string(reinterpret_cast<const char*>(verdict.data()), verdict.size());
  });
  CHECK(decisions.load() == 1);
  for (const auto& v : got) CHECK(v == "0,10,20,30,");
}

TEST_CASE("agree_at_root: a failing rank or a throwing decide is the verdict everywhere") {
  SUBCASE("the lowest failing rank wins, and decide does not run") {
    std::atomic<int> decisions{0};
    auto got = cairn::run_ranks_collect(3, [&](cairn::thread_communicator& c) {
      std::optional<cairn::error> mine;
      if (c.rank() >= 1) mine = agree_test::full_error(c.rank());
      auto [status, verdict] =
          cairn::agree_at_root(c, 0, mine, {}, [&](const std::vector<cairn::bytes>&) {
            decisions.fetch_add(1);
            return std::pair<std::optional<cairn::error>, cairn::bytes>(std::nullopt, {});
          });
      return status.value_or(cairn::error{}).describe() + " / " + std::to_string(verdict.size());
    });
    CHECK(decisions.load() == 0);
    for (const auto& s : got)
      CHECK(s == "corrupt: bad block on rank 1 [key=w1 rank=1 file=__1_0.distcp offset=0] / 0");
  }
  SUBCASE("decide's own failure, and what it throws, are tagged with root") {
    auto got = cairn::run_ranks_collect(2, [](cairn::thread_communicator& c) {
      auto [refused, p1] = cairn::agree_at_root(c, 1, std::nullopt, {}, [](const auto&) {
        return std::pair{std::optional<cairn::error>(
                             cairn::make_error(cairn::errc::integrity, "shards overlap")),
                         cairn::bytes{}};
      });
      auto [thrown, p2] = cairn::agree_at_root(
          c, 1, std::nullopt, {},
          [](const auto&) -> std::pair<std::optional<cairn::error>, cairn::bytes> {
            throw std::runtime_error("plan too large");
          });
      return refused->describe() + " / " + thrown->describe();
    });
    for (const auto& s : got)
      CHECK(s ==
            "integrity: shards overlap [rank=1] / io: deciding at the root failed: plan too large "
            "[rank=1]");
  }
}

TEST_CASE("a malformed status from a peer is that peer's comm error, not a wrong answer") {
  cairn::detail::message_writer lying;
  const std::uint8_t failed = 1;
  const std::uint64_t code = 1;
  lying.raw(&failed, 1);
  lying.raw(&code, 4);                // errc
  lying.count(std::size_t{1} << 60);  // message length far past the end
  cairn::bytes no_payload = cairn::detail::encode_message(std::optional<cairn::error>());
  for (const cairn::bytes& bad :
       {cairn::bytes{}, cairn::bytes{std::byte{1}}, lying.data(), no_payload}) {
    CAPTURE(bad.size());
    agree_test::peer_sends c{bad};
    const cairn::rank_statuses got = cairn::agree(c, std::nullopt, agree_test::text("mine"));
    const std::optional<cairn::error> f = got.first_failure();
    REQUIRE(f.has_value());
    CHECK(f->code == cairn::errc::comm);
    CHECK(f->message.find("malformed status between ranks") != std::string::npos);
    CHECK(f->rank == 1);
  }
  cairn_test::check_message(cairn::detail::status_message{
      cairn::make_error(cairn::errc::io, "disk full").with_file("f"), agree_test::text("p")});
}
