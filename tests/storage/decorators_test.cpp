// The storage decorators' own behaviour, over memory_storage and file_storage: throttled_storage
// keeps to its rates, cached_storage downloads once and invalidates on writes, writer_slots and
// writer_slot_storage let at most `limit` writers run at once. (conformance_test.cpp checks that
// each is otherwise invisible.)
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
#include "cairn/storage/writer_slots.hpp"
#include "tests/storage/conformance.hpp"

using namespace cairn_storage_test;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A backend for tests that counts how many puts and writer calls run at the same time (each
/// takes `hold`), forwarding to a memory_storage.
class concurrency_probe {
 public:
  explicit concurrency_probe(std::chrono::milliseconds hold) : hold_(hold) {}
  static constexpr cairn::storage_features features = cairn::memory_storage::features;

  int most_at_once() const { return most_.load(); }

  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    busy b(*this);
    return mem_.put(name, data);
  }
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, mem_.open_writer(name));
    return std::unique_ptr<cairn::object_writer>(std::make_unique<writer>(*this, std::move(w)));
  }
  cairn::result<void> read(std::string_view n, std::uint64_t o, std::span<std::byte> out) {
    return mem_.read(n, o, out);
  }
  cairn::result<std::uint64_t> size(std::string_view n) { return mem_.size(n); }
  cairn::result<bool> exists(std::string_view n) { return mem_.exists(n); }
  cairn::result<std::vector<std::string>> list(std::string_view p) { return mem_.list(p); }
  cairn::result<void> remove(std::string_view n) { return mem_.remove(n); }
  std::string describe(std::string_view n) const { return mem_.describe(n); }

 private:
  struct busy {
    concurrency_probe& p;
    explicit busy(concurrency_probe& probe) : p(probe) {
      int now = ++p.in_flight_;
      int most = p.most_.load();
      while (now > most && !p.most_.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(p.hold_);
    }
    ~busy() { --p.in_flight_; }
  };
  class writer final : public cairn::object_writer {
   public:
    writer(concurrency_probe& p, std::unique_ptr<cairn::object_writer> w)
        : p_(p), w_(std::move(w)) {}
    cairn::result<void> write_at(std::uint64_t o, std::span<const std::byte> d) override {
      busy b(p_);
      return w_->write_at(o, d);
    }
    cairn::result<void> finish() override {
      busy b(p_);
      return w_->finish();
    }

   private:
    concurrency_probe& p_;
    std::unique_ptr<cairn::object_writer> w_;
  };

  std::chrono::milliseconds hold_;
  cairn::memory_storage mem_;
  std::atomic<int> in_flight_{0}, most_{0};
};
static_assert(cairn::storage<concurrency_probe>);

}  // namespace

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

  TEST_CASE("reads keep to the read rate; rate 0 leaves a direction alone") {
    cairn::memory_storage mem;
    require_ok(mem.put("r", pattern(1 << 20)));
    cairn::throttled_storage paced{mem, {.read_bytes_per_second = 8u << 20}};
    bytes out(1 << 20);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) require_ok(paced.read("r", 0, out));
    CHECK(seconds_since(t0) >= 0.45);  // the fifth MiB leaves at 0.5 s
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) require_ok(paced.put("fast", pattern(1 << 20)));
    CHECK(seconds_since(t0) < 0.5);
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

TEST_SUITE("cached_storage") {
  TEST_CASE("the first read downloads the object whole; later reads are local") {
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

  TEST_CASE("objects changed behind its back are not seen; a new decorator sees them") {
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

  TEST_CASE("no limit holds nothing; an unusable directory goes ahead without a slot") {
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
