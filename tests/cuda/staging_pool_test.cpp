// tests/cuda/staging_pool_test.cpp: the staging pool: sizing, reuse without allocation, growth,
// pre-touch, alignment, and concurrent acquisition.
#include "cairn/cuda/staging_pool.hpp"

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/cuda/testing/fake_runtime.hpp"
#include "tests/cuda/counting_resource.hpp"

namespace cc = cairn::cuda;

namespace {
// Fraction of the pages of `buf` resident in memory (mincore).
double resident_fraction(std::span<std::byte> buf) {
  auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<std::uintptr_t>(buf.data()) / page * page;
  auto end = reinterpret_cast<std::uintptr_t>(buf.data() + buf.size());
  std::size_t pages = (end - begin + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  REQUIRE(::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) == 0);
  std::size_t in = 0;
  for (unsigned char v : vec) in += v & 1;
  return static_cast<double>(in) / static_cast<double>(pages);
}
}  // namespace

TEST_SUITE("cuda staging pool") {
  TEST_CASE("reserve allocates once, later saves that fit reuse the buffer") {
    cc::testing::counting_resource counted;
    cc::staging_pool pool(counted, {.granularity = 4096});
    CHECK(pool.capacity() == 0);
    REQUIRE(pool.reserve(100000));
    CHECK(pool.capacity() >= 100000);
    CHECK(counted.allocations() == 1);
    for (int save = 0; save < 5; ++save) {
      REQUIRE(pool.reserve(100000 - static_cast<std::size_t>(save)));
      for (int i = 0; i < 10; ++i) REQUIRE(pool.acquire(9000));
      pool.reset();
    }
    CHECK(counted.allocations() == 1);
    CHECK(pool.allocations() == 1);
    // A bigger plan grows the pool once, freeing the old buffer.
    REQUIRE(pool.reserve(300000));
    CHECK(counted.allocations() == 2);
    CHECK(counted.live() == 1);
    CHECK(pool.capacity() >= 300000);
  }

  TEST_CASE("growing while spans are acquired is refused") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr, {.granularity = 4096});
    REQUIRE(pool.reserve(4096));
    REQUIRE(pool.acquire(100));
    auto r = pool.reserve(1 << 20);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().message.find("reset() first") != std::string::npos);
    pool.reset();
    CHECK(pool.reserve(1 << 20));
  }

  TEST_CASE("acquire aligns spans, stops at capacity, and reset releases everything") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr, {.granularity = 4096});
    REQUIRE(pool.reserve(8192));
    auto a = pool.acquire(1);
    auto b = pool.acquire(10, 256);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(reinterpret_cast<std::uintptr_t>(b->data()) % 256 == 0);
    CHECK(b->data() > a->data());
    auto full = pool.acquire(8192);
    REQUIRE_FALSE(full);
    CHECK(full.err().message.find("staging pool full") != std::string::npos);
    CHECK(pool.try_acquire(8192) == nullptr);
    pool.reset();
    CHECK(pool.used() == 0);
    CHECK(pool.acquire(8192));
    CHECK(pool.acquire(0));  // an empty span still fits
  }

  TEST_CASE("bytes_for matches what acquire consumes") {
    std::vector<std::size_t> sizes{1, 63, 64, 65, 1000, 0};
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr, {.granularity = 64});
    REQUIRE(pool.reserve(cc::staging_pool::bytes_for(sizes)));
    for (std::size_t n : sizes) CHECK(pool.acquire(n));
  }

  TEST_CASE("a new buffer is pre-touched: every page resident before the first save") {
    cc::aligned_host_resource mr;
    constexpr std::size_t bytes = std::size_t{64} << 20;
    cc::staging_pool touched(mr, {.pre_touch = true});
    REQUIRE(touched.reserve(bytes));
    CHECK(resident_fraction(touched.buffer()) == doctest::Approx(1.0));
    cc::staging_pool lazy(mr, {.pre_touch = false});
    REQUIRE(lazy.reserve(bytes));
    double lazy_resident = resident_fraction(lazy.buffer());
    MESSAGE("resident fraction without pre-touch: " << lazy_resident);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    CHECK(lazy_resident < 0.5);  // fresh memory: the check above is not vacuous
#endif
  }

  TEST_CASE("concurrent acquire hands out disjoint aligned spans") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr, {.granularity = 4096});
    constexpr int threads = 4, per_thread = 500;
    REQUIRE(pool.reserve(std::size_t{threads} * per_thread * 128));
    std::vector<std::vector<std::pair<std::byte*, std::size_t>>> got(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < per_thread; ++i) {
          std::size_t n = static_cast<std::size_t>(1 + (i * 7 + t) % 64);
          std::byte* p = pool.try_acquire(n, 64);
          if (!p) continue;
          std::memset(p, t, n);
          got[static_cast<std::size_t>(t)].emplace_back(p, n);
        }
      });
    for (auto& t : ts) t.join();
    std::vector<std::pair<std::byte*, std::size_t>> all;
    for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
    CHECK(all.size() == std::size_t{threads} * per_thread);
    std::sort(all.begin(), all.end());
    for (std::size_t i = 0; i < all.size(); ++i) {
      CHECK(reinterpret_cast<std::uintptr_t>(all[i].first) % 64 == 0);
      if (i > 0) CHECK(all[i - 1].first + all[i - 1].second <= all[i].first);
    }
  }

  TEST_CASE("a pool over a fake device uses pinned memory, without a device, aligned memory") {
    cc::testing::fake_runtime fake;
    {
      cc::staging_pool pool({}, &fake.api());
      CHECK(pool.pinned());
      REQUIRE(pool.reserve(1 << 20));
      CHECK(fake.live_pinned() == 1);
      CHECK(pool.describe().find("pinned") != std::string::npos);
    }
    CHECK(fake.live_pinned() == 0);
    cc::testing::fake_runtime nodriver;
    nodriver.fail_device_count(35);
    cc::staging_pool pool({}, &nodriver.api());
    CHECK_FALSE(pool.pinned());
    REQUIRE(pool.reserve(1 << 20));
    CHECK(nodriver.stats().host_allocs == 0);
    CHECK(pool.describe().find("code 35") != std::string::npos);
  }
}
