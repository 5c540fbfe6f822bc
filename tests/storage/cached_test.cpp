// cached_storage (storage/cached.hpp): the first read downloads an object whole and later reads
// are local; writes through it invalidate the copy; failed downloads leave nothing behind.
// (conformance_test.cpp checks that it is otherwise invisible.)
#include "cairn/storage/cached.hpp"

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

#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/throttled.hpp"
#include "cairn/storage/writer_slots.hpp"
#include "tests/storage/concurrency_probe.hpp"
#include "tests/storage/conformance.hpp"

using namespace cairn_storage_test;

TEST_SUITE("cached_storage") {
  TEST_CASE("the first read downloads the object whole, later reads are local") {
    temp_dir d;
    cairn::memory_storage mem;
    cairn::faulty_storage counted{mem};
    cairn::cached_storage cache{counted, d.path, /*chunk_bytes=*/10000};
    bytes data = pattern(50000, 9);
    require_ok(cache.put("c/x.bin", data));
    bytes out(100);
    for (int i = 0; i < 5; ++i) {
      require_ok(cache.read("c/x.bin", 1000 * i, out));
      CHECK(std::equal(out.begin(), out.end(), data.begin() + 1000 * i));
    }
    CHECK(cache.downloads() == 1);
    CHECK(counted.reads() == 5);  // 50000 bytes in reads of 10000
    CHECK(counted.bytes_read() == data.size());
    CHECK(fs::file_size(cache.directory() / "c/x.bin") == data.size());

    bytes tail(20);
    auto r = cache.read("c/x.bin", 49990, tail);
    REQUIRE(!r);
    CHECK(r.err().code == errc::corrupt);
    CHECK(r.err().message.find("truncated") != std::string::npos);
    CHECK(r.err().file == mem.describe("c/x.bin"));
    CHECK(*r.err().offset == 50000);
    CHECK(counted.reads() == 5);
  }

  TEST_CASE("put, writers and remove through it invalidate the local copy") {
    temp_dir d;
    cairn::memory_storage mem;
    cairn::cached_storage cache{mem, d.path};
    require_ok(cache.put("o", pattern(100, 1)));
    CHECK(read_all(cache, "o") == pattern(100, 1));
    require_ok(cache.put("o", pattern(10, 2)));
    CHECK(read_all(cache, "o") == pattern(10, 2));

    auto w = cache.open_writer("o");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(30, 3)));
    CHECK(read_all(cache, "o") == pattern(10, 2));  // the old object until finish
    require_ok((*w)->finish());
    CHECK(read_all(cache, "o") == pattern(30, 3));

    require_ok(cache.remove("o"));
    bytes out(1);
    CHECK(cache.read("o", 0, out).err().code == errc::not_found);
    CHECK(cache.downloads() == 3);
  }

  TEST_CASE("objects changed behind its back are not seen, a new decorator sees them") {
    temp_dir d;
    cairn::file_storage disk{d.path / "root"};
    require_ok(disk.put("m", text("one")));
    fs::path local;
    {
      cairn::cached_storage cache{disk, d.path / "cache"};
      CHECK(read_all(cache, "m") == text("one"));
      require_ok(disk.put("m", text("two")));
      CHECK(read_all(cache, "m") == text("one"));
      local = cache.directory();
      CHECK(fs::exists(local / "m"));
    }
    CHECK(!fs::exists(local));  // the local copies go with the decorator
    cairn::cached_storage again{disk, d.path / "cache"};
    CHECK(again.directory() != local);
    CHECK(read_all(again, "m") == text("two"));
  }

  TEST_CASE("a failed download leaves nothing behind and is retried") {
    temp_dir d;
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    cairn::cached_storage cache{faulty, d.path, 1000};
    require_ok(mem.put("f", pattern(5000)));
    faulty.fail_reads_of("f");
    bytes out(10);
    auto r = cache.read("f", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::io);
    CHECK(fs::is_empty(cache.directory()));
    faulty.disarm();
    require_ok(cache.read("f", 100, out));
    CHECK(std::equal(out.begin(), out.end(), pattern(5000).begin() + 100));
  }

  TEST_CASE("many threads reading one object download it once") {
    temp_dir d;
    cairn::memory_storage mem;
    cairn::faulty_storage counted{mem};
    cairn::cached_storage cache{counted, d.path, 1 << 16};
    bytes data = pattern(1 << 20, 4);
    require_ok(mem.put("big", data));
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        bytes out(4096);
        for (int k = 0; k < 50; ++k) {
          std::size_t off = static_cast<std::size_t>((t * 50 + k) * 3001) % (data.size() - 4096);
          if (!cache.read("big", off, out) ||
              !std::equal(out.begin(), out.end(), data.begin() + static_cast<std::ptrdiff_t>(off)))
            ++bad;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(bad == 0);
    CHECK(cache.downloads() == 1);
    CHECK(counted.bytes_read() == data.size());
  }
}
