// tests/comm/single_test.cpp: cairn/comm/single.hpp: single_communicator as rank 0 of 1, what
// each collective returns (copies, never aliases), and the argument checks (a root other than 0,
// an all_to_all without exactly one buffer) with their errc and messages, directly and through
// comm_ref.
#include "cairn/comm/single.hpp"

#include <doctest/doctest.h>

#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"

namespace single_test {

/// The error `f` throws as cairn::exception; fails the test when it throws nothing.
template <class F>
cairn::error thrown_by(F&& f) {
  try {
    f();
  } catch (const cairn::exception& e) {
    return e.err();
  }
  FAIL_CHECK("no cairn::exception");
  return {};
}

inline cairn::bytes some_bytes() { return {std::byte{1}, std::byte{0}, std::byte{255}}; }

}  // namespace single_test

TEST_CASE("single_communicator is rank 0 of a world of 1") {
  static_assert(cairn::scalable_communicator<cairn::single_communicator>);
  const cairn::single_communicator c;
  static_assert(noexcept(c.rank())&& noexcept(c.size()));
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  cairn::single_communicator m;
  static_assert(noexcept(m.barrier()));
  m.barrier();
  cairn::comm_ref ref(m);
  CHECK(ref.rank() == 0);
  CHECK(ref.size() == 1);
  CHECK(ref.scalable());  // its own gather and all_to_all, no fallback
}

TEST_CASE("single_communicator collectives return copies of what this rank gave") {
  cairn::single_communicator c;
  cairn::bytes data = single_test::some_bytes();
  auto all = c.all_gather(data);
  REQUIRE(all.size() == 1);
  CHECK(all[0] == data);
  CHECK(all[0].data() != data.data());  // a copy
  data[0] = std::byte{9};
  CHECK(all[0] == single_test::some_bytes());

  auto empty = c.all_gather({});
  REQUIRE(empty.size() == 1);
  CHECK(empty[0].empty());

  auto g = c.gather(data, 0);
  REQUIRE(g.size() == 1);
  CHECK(g[0] == data);

  cairn::bytes buf = single_test::some_bytes();
  c.broadcast(buf, 0);
  CHECK(buf == single_test::some_bytes());
  cairn::bytes none;
  c.broadcast(none, 0);
  CHECK(none.empty());

  std::vector<cairn::bytes> to{single_test::some_bytes()};
  auto got = c.all_to_all(to);
  CHECK(got == to);
  to[0].clear();
  CHECK(got[0] == single_test::some_bytes());
  CHECK(c.all_to_all({cairn::bytes{}}) == std::vector<cairn::bytes>{cairn::bytes{}});
}

TEST_CASE("single_communicator refuses roots other than 0, naming the root") {
  cairn::single_communicator c;
  cairn::comm_ref ref(c);
  for (int root : {1, -1, INT_MAX, INT_MIN}) {
    CAPTURE(root);
    const std::string r = std::to_string(root);
    cairn::bytes buf = single_test::some_bytes();
    for (auto e : {single_test::thrown_by([&] { c.broadcast(buf, root); }),
                   single_test::thrown_by([&] { ref.broadcast(buf, root); })}) {
      CHECK(e.code == cairn::errc::invalid_argument);
      CHECK(e.message == "broadcast root " + r + " is out of range for a communicator of size 1");
      CHECK(e.rank == 0);
    }
    CHECK(buf == single_test::some_bytes());
    for (auto e : {single_test::thrown_by([&] { (void)c.gather(buf, root); }),
                   single_test::thrown_by([&] { (void)ref.gather(buf, root); })}) {
      CHECK(e.code == cairn::errc::invalid_argument);
      CHECK(e.message == "gather root " + r + " is out of range for a communicator of size 1");
      CHECK(e.rank == 0);
    }
  }
}

TEST_CASE("single_communicator all_to_all needs exactly one buffer") {
  cairn::single_communicator c;
  cairn::comm_ref ref(c);
  for (std::size_t n : {0u, 2u, 5u}) {
    CAPTURE(n);
    std::vector<cairn::bytes> to(n, single_test::some_bytes());
    for (auto e : {single_test::thrown_by([&] { (void)c.all_to_all(to); }),
                   single_test::thrown_by([&] { (void)ref.all_to_all(to); })}) {
      CHECK(e.code == cairn::errc::invalid_argument);
      CHECK(e.message == "all_to_all needs one buffer per rank (1), got " + std::to_string(n));
      CHECK(e.rank == 0);
    }
  }
  // The communicator stays usable after a refused call.
  CHECK(c.all_gather(single_test::some_bytes()).size() == 1);
}
