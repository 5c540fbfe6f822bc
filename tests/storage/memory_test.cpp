// memory_storage (storage/memory.hpp): what only the memory backend does: its features, puts
// that copy, writers that buffer privately (growth, overlaps, misuse, hostile offsets, threads),
// string-prefix lists, and the test hooks truncate, corrupt_byte, contents and the counters.
#include "cairn/storage/memory.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/storage/conformance.hpp"

TEST_SUITE("memory_storage") {
  TEST_CASE("memory features, puts that copy, and a moved storage keeps its objects") {
    using namespace cairn_storage_test;
    CHECK(cairn::memory_storage::features ==
          cairn::storage_features{.read_after_write = true,
                                  .list_after_write = true,
                                  .atomic_put = true,
                                  .writer_hidden_until_finish = true});
    cairn::memory_storage mem;
    bytes src = pattern(16);
    require_ok(mem.put("p", src));
    src[0] ^= std::byte{1};  // the object is a copy
    CHECK(mem.contents("p") == pattern(16));
    cairn::memory_storage moved = std::move(mem);
    CHECK(read_all(moved, "p") == pattern(16));
    CHECK(moved.object_count() == 1);
  }

  TEST_CASE("a memory writer grows its buffer, later writes win, finish publishes once") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    auto w = mem.open_writer("w");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(4, text("efgh")));
    require_ok((*w)->write_at(0, text("ab")));
    require_ok((*w)->write_at(1, text("XYZ")));  // overlaps both
    require_ok((*w)->write_at(8, {}));           // at the end: changes nothing
    CHECK(!mem.exists("w").value());
    // A second writer of the same name is independent; the last finish wins.
    auto w2 = mem.open_writer("w");
    REQUIRE(w2.has_value());
    require_ok((*w2)->write_at(0, text("second")));
    require_ok((*w2)->finish());
    CHECK(mem.contents("w") == text("second"));
    require_ok((*w)->finish());
    bytes want = text("aXYZefgh");
    CHECK(mem.contents("w") == want);

    auto again = (*w)->finish();
    REQUIRE(!again);
    CHECK(again.err().code == errc::invalid_argument);
    CHECK(again.err().file == "mem://w");
    auto late = (*w)->write_at(0, text("z"));
    REQUIRE(!late);
    CHECK(late.err().code == errc::invalid_argument);
    CHECK(late.err().message.find("after finish") != std::string::npos);
    CHECK(late.err().file == "mem://w");
    CHECK(mem.contents("w") == want);  // neither changed the object
  }

  TEST_CASE("hostile writer offsets are refused, not thrown or allocated") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    auto w = mem.open_writer("h/x");
    REQUIRE(w.has_value());
    const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const bytes one = pattern(1);
    struct attempt {
      std::uint64_t offset;
      std::size_t len;
    };
    for (attempt a : {attempt{max, 1}, attempt{max, 0}, attempt{max - 1, 1},
                      attempt{std::uint64_t{1} << 63, 1}, attempt{std::uint64_t{1} << 63, 0}}) {
      CAPTURE(a.offset);
      auto r = (*w)->write_at(a.offset, std::span(one).first(a.len));
      REQUIRE(!r);
      CHECK(r.err().code == errc::invalid_argument);
      CHECK(r.err().file == "mem://h/x");
      CHECK(*r.err().offset == a.offset);
    }
    require_ok((*w)->write_at(2, one));  // the writer still works
    require_ok((*w)->finish());
    CHECK(mem.size("h/x").value() == 3);

    bytes out(1);
    auto far = mem.read("h/x", max, out);
    REQUIRE(!far);
    CHECK(far.err().code == errc::corrupt);
    CHECK(*far.err().offset == max);
    CHECK(far.err().message.find("ends at byte 3") != std::string::npos);
  }

  TEST_CASE("threads writing one memory writer, growing it and filling it in") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    auto w = mem.open_writer("t");
    REQUIRE(w.has_value());
    constexpr int chunks = 64;
    constexpr std::size_t chunk = 1000;
    const bytes all = pattern(chunks * chunk, 5);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Each thread writes every fourth chunk from the end: some grow, some fill in.
        for (int c = chunks - 1 - t; c >= 0; c -= 4) {
          auto at = static_cast<std::size_t>(c) * chunk;
          CHECK((*w)->write_at(at, std::span(all).subspan(at, chunk)).has_value());
        }
      });
    }
    for (auto& t : threads) t.join();
    require_ok((*w)->finish());
    CHECK(mem.contents("t") == all);
  }

  TEST_CASE("memory list matches string prefixes, sorted") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    for (const char* n : {"b", "ab", "a/b.bin", "a.bin", "a0", "a/c/d"}) require_ok(mem.put(n, {}));
    CHECK(list_of(mem, "a") == std::vector<std::string>{"a.bin", "a/b.bin", "a/c/d", "a0", "ab"});
    CHECK(list_of(mem, "a/") == std::vector<std::string>{"a/b.bin", "a/c/d"});
    CHECK(list_of(mem, "a/c/d") == std::vector<std::string>{"a/c/d"});
    CHECK(list_of(mem, "c").empty());
    CHECK(list_of(mem, "").size() == 6);
    auto bad = mem.list("a//");
    REQUIRE(!bad);
    CHECK(bad.err().code == errc::invalid_argument);
  }

  TEST_CASE("truncate and corrupt_byte change what later reads see, counters follow") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    require_ok(mem.put("o", pattern(100)));
    require_ok(mem.put("q", pattern(10)));
    CHECK(mem.total_bytes() == 110);
    CHECK(mem.corrupt_byte("o", 99));
    CHECK(!mem.corrupt_byte("o", 100));
    bytes got = read_all(mem, "o");
    CHECK(got[99] == ~pattern(100)[99]);
    CHECK(mem.corrupt_byte("o", 99));  // flipping twice restores it
    CHECK(read_all(mem, "o") == pattern(100));

    CHECK(mem.truncate("o", 40));
    CHECK(mem.total_bytes() == 50);
    bytes out(20);
    auto r = mem.read("o", 30, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::corrupt);
    CHECK(*r.err().offset == 40);
    CHECK(r.err().message.find("mem://o") != std::string::npos);
    CHECK(mem.truncate("o", 0));
    CHECK(mem.size("o").value() == 0);
    CHECK(!mem.truncate("o", 0));

    require_ok(mem.remove("q"));
    CHECK(mem.object_count() == 1);
    CHECK(mem.total_bytes() == 0);
    CHECK(!mem.contents("q").has_value());
    auto gone = mem.remove("q");
    REQUIRE(!gone);
    CHECK(gone.err().code == errc::not_found);
    CHECK(gone.err().file == "mem://q");
  }
}
