// throttled_storage (storage/throttled.hpp) over memory_storage: writes and reads keep to their
// rates; features, describe and remove_temporaries are forwarded. (conformance_test.cpp checks
// that it is otherwise invisible.)
#include "cairn/storage/throttled.hpp"

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
#include "cairn/storage/writer_slots.hpp"
#include "tests/storage/concurrency_probe.hpp"
#include "tests/storage/conformance.hpp"

using namespace cairn_storage_test;

TEST_SUITE("throttled_storage") {
  TEST_CASE("puts and writers keep to the write rate") {
    cairn::memory_storage mem;
    cairn::throttled_storage paced{mem, {.write_bytes_per_second = 4u << 20}};
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) require_ok(paced.put("t" + std::to_string(i), pattern(1 << 20)));
    // 4 MiB at 4 MiB/s: the first MiB goes at once, the last leaves at 0.75 s.
    CHECK(seconds_since(t0) >= 0.7);

    auto w = paced.open_writer("w");
    REQUIRE(w.has_value());
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) require_ok((*w)->write_at(i << 20, pattern(1 << 20)));
    require_ok((*w)->finish());
    CHECK(seconds_since(t0) >= 0.7);  // the rate is shared with the puts before
    CHECK(read_all(mem, "w").size() == 4u << 20);
  }

  TEST_CASE("reads keep to the read rate, rate 0 leaves a direction alone") {
    cairn::memory_storage mem;
    require_ok(mem.put("r", pattern(1 << 20)));
    cairn::throttled_storage paced{mem, {.read_bytes_per_second = 8u << 20}};
    bytes out(1 << 20);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) require_ok(paced.read("r", 0, out));
    CHECK(seconds_since(t0) >= 0.45);  // the fifth MiB leaves at 0.5 s
    // Writes are not paced: 20 MiB of puts take about as long as through a decorator with no
    // rates at all, measured alike (paced at 8 MiB/s they would take 2.5 s more).
    const bytes mib = pattern(1 << 20);
    cairn::throttled_storage unpaced{mem, {}};
    auto time_puts = [&](auto& st) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) require_ok(st.put("fast", mib));
      return seconds_since(start);
    };
    const double plain = time_puts(unpaced);
    CHECK(time_puts(paced) < plain + 1.0);
  }

  TEST_CASE("forwards features, describe and remove_temporaries") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    cairn::throttled_storage paced{disk, {}};
    cairn::storage_ref s = paced;
    CHECK(s.features() == cairn::file_storage::features);
    CHECK(s.describe("a") == disk.describe("a"));
    CHECK(s.remove_temporaries("").value() == 0);
  }
}
