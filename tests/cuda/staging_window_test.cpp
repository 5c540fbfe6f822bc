// tests/cuda/staging_window_test.cpp: the staging window against the fake runtime: slots taken
// from many threads (never more than it has), copies in both directions within a slot, the
// mover packing many runs across slot boundaries, and the errors: a pool in use, a copy that
// does not fit, a failed copy, a device fault at the wait.
#include "cairn/cuda/staging_window.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/testing/fake_runtime.hpp"

using cairn::cuda::staging_pool;
using cairn::cuda::staging_window;
using cairn::cuda::window_mover;
using cairn::cuda::testing::fake_runtime;

namespace {

std::vector<std::byte> window_pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

}  // namespace

TEST_CASE("staging window: slots are shared by many threads, never more than it has") {
  fake_runtime fake;
  staging_pool pool({}, &fake.api());
  auto w = staging_window::open(pool, fake.api(), 4096, 3).value();
  CHECK(w->slots() == 3);
  CHECK(w->piece_bytes() == 4096);
  CHECK(pool.used() >= 3 * 4096);
  const std::vector<std::byte> src = window_pattern(8 * 4096, 1);
  void* dev = fake.device_malloc(src.size());
  fake.device_write(dev, src.data(), src.size());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        staging_window::slot s = w->take();
        const std::size_t at = static_cast<std::size_t>(t) * 4096;
        if (!s.from_device(0, static_cast<std::byte*>(dev) + at, 4096) || !s.wait() ||
            std::memcmp(s.bytes().data(), src.data() + at, 4096) != 0)
          ++bad;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  CHECK(w->peak_slots() <= 3);
  CHECK(w->peak_slots() >= 1);
  w.reset();
  CHECK(fake.live_streams() == 0);
  fake.device_free(dev);
  CHECK(fake.misuse().empty());
}

TEST_CASE("staging window: the mover packs runs across slots, both ways") {
  fake_runtime fake;
  staging_pool pool({}, &fake.api());
  auto w = staging_window::open(pool, fake.api(), 1000, 1).value();
  const std::vector<std::byte> src = window_pattern(10'000, 2);
  void* dev = fake.device_malloc(src.size());
  {
    // Runs of 7, 1500 (more than a slot) and 300 bytes, scattered, then the gaps.
    window_mover m(*w);
    auto* d = static_cast<std::byte*>(dev);
    REQUIRE(m.put(d + 3, src.data() + 3, 7));
    REQUIRE(m.put(d + 5000, src.data() + 5000, 1500));
    REQUIRE(m.put(d + 9700, src.data() + 9700, 300));
    REQUIRE(m.put(d, src.data(), 3));
    REQUIRE(m.put(d + 10, src.data() + 10, 4990));
    REQUIRE(m.put(d + 6500, src.data() + 6500, 3200));
    REQUIRE(m.flush());
  }
  CHECK(fake.device_read(dev, src.size()) == src);
  window_mover m(*w);
  std::vector<std::byte> back(src.size());
  REQUIRE(m.get(back.data(), dev, back.size()));  // ten pieces through one 1000-byte slot
  CHECK(back == src);
  REQUIRE(m.flush());
  fake.device_free(dev);
  CHECK(fake.misuse().empty());
}

TEST_CASE("staging window: errors name what failed") {
  fake_runtime fake;
  staging_pool pool({}, &fake.api());
  SUBCASE("a pool in use is refused") {
    pool.reserve(1 << 20).value();
    (void)pool.acquire(64).value();
    auto w = staging_window::open(pool, fake.api(), 4096, 2);
    REQUIRE(!w);
    CHECK(w.err().code == cairn::errc::invalid_argument);
    CHECK(w.err().message.find("in use") != std::string::npos);
  }
  SUBCASE("zero slots") { CHECK(!staging_window::open(pool, fake.api(), 4096, 0)); }
  SUBCASE("copies that do not fit, fail or fault") {
    auto w = staging_window::open(pool, fake.api(), 4096, 1).value();
    void* dev = fake.device_malloc(8192);
    staging_window::slot s = w->take();
    auto big = s.from_device(100, dev, 4096);
    REQUIRE(!big);
    CHECK(big.err().message.find("do not fit") != std::string::npos);
    fake.fail_memcpy(0, 2);
    auto failed = s.from_device(0, dev, 4096);
    REQUIRE(!failed);
    CHECK(failed.err().code == cairn::errc::io);
    CHECK(failed.err().message.find("device to host, 4096 bytes") != std::string::npos);
    REQUIRE(s.to_device(dev, 0, 4096));
    fake.fail_next_sync(700);
    auto fault = s.wait();
    REQUIRE(!fault);
    CHECK(fault.err().message.find("illegal memory access") != std::string::npos);
    fake.device_free(dev);
  }
  CHECK(fake.misuse().empty());
}
