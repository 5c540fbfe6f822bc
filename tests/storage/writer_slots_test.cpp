// writer_slots and writer_slot_storage (storage/writer_slots.hpp): at most `limit` writers run at
// once, across threads. (conformance_test.cpp checks that the decorator is otherwise invisible.)
#include "cairn/storage/writer_slots.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cairn/storage/cached.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/throttled.hpp"
#include "tests/storage/concurrency_probe.hpp"
#include "tests/storage/conformance.hpp"

using namespace cairn_storage_test;

TEST_SUITE("writer_slots") {
  TEST_CASE("at most `limit` holders at once, across threads") {
    temp_dir d;
    for (int limit : {1, 2, 3}) {
      CAPTURE(limit);
      cairn::writer_slots slots{limit, d.path.string()};
      std::atomic<int> in{0}, most{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 6; ++t) {
        threads.emplace_back([&] {
          for (int k = 0; k < 3; ++k) {
            cairn::writer_slot s = slots.acquire();
            CHECK(s.held());
            int now = ++in;
            int m = most.load();
            while (now > m && !most.compare_exchange_weak(m, now)) {
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            --in;
          }
        });
      }
      for (auto& t : threads) t.join();
      CHECK(most.load() <= limit);
      CHECK(most.load() >= 1);
      CHECK(fs::exists(slots.lock_path(limit - 1)));
    }
  }

  TEST_CASE("no limit holds nothing, an unusable directory goes ahead without a slot") {
    cairn::writer_slots none{0, "/nonexistent"};
    CHECK(!none.acquire().held());
    cairn::writer_slots bad{2, "/nonexistent/cairn-test-dir"};
    CHECK(!bad.acquire().held());
    cairn::writer_slots bad1{1, "/nonexistent/cairn-test-dir"};
    CHECK(!bad1.acquire().held());
  }

  TEST_CASE("a slot is released when its guard dies or is moved from") {
    temp_dir d;
    cairn::writer_slots slots{1, d.path.string()};
    cairn::writer_slot a = slots.acquire();
    cairn::writer_slot b = std::move(a);
    CHECK(!a.held());
    CHECK(b.held());
    b = cairn::writer_slot{};
    cairn::writer_slot c = slots.acquire();  // would wait forever if b still held it
    CHECK(c.held());
  }
}

TEST_SUITE("writer_slot_storage") {
  TEST_CASE("puts and writer calls of every thread take turns in the slots") {
    temp_dir d;
    for (int limit : {1, 2}) {
      CAPTURE(limit);
      concurrency_probe probe{std::chrono::milliseconds(3)};
      cairn::writer_slot_storage s{probe, cairn::writer_slots{limit, d.path.string()}};
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
          for (int k = 0; k < 3; ++k) require_ok(s.put("p" + std::to_string(t), pattern(10)));
          auto w = s.open_writer("w" + std::to_string(t));
          REQUIRE(w.has_value());
          for (int k = 0; k < 3; ++k) require_ok((*w)->write_at(k * 10, pattern(10)));
          require_ok((*w)->finish());
        });
      }
      for (auto& t : threads) t.join();
      CHECK(probe.most_at_once() <= limit);
      CHECK(read_all(s, "w3").size() == 30);
    }
  }

  TEST_CASE("a thread holding several writers open never waits on itself") {
    temp_dir d;
    cairn::memory_storage mem;
    cairn::writer_slot_storage s{mem, cairn::writer_slots{1, d.path.string()}};
    auto a = s.open_writer("a");
    auto b = s.open_writer("b");
    REQUIRE(a.has_value());
    REQUIRE(b.has_value());
    require_ok((*a)->write_at(0, pattern(5)));
    require_ok((*b)->write_at(0, pattern(5)));
    require_ok(s.put("c", pattern(5)));
    require_ok((*b)->finish());
    require_ok((*a)->finish());
    CHECK(s.list("").value() == std::vector<std::string>{"a", "b", "c"});
    CHECK(cairn::storage_ref(s).features() == cairn::memory_storage::features);
  }
}
