// tests/cuda/stager_test.cpp: staging host and (fake) device sources into the pool and back,
// ordering against a caller's stream, error propagation, fallback without a device, and the
// steady state: after the first save, staging makes no large heap allocation and the pool
// allocates nothing.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/testing/fake_runtime.hpp"
#include "tests/cuda/counting_resource.hpp"

// --- global operator new, counting allocations of 1 MiB or more -----------------------------
// The replacements pair malloc/aligned_alloc with free on purpose; g++ cannot see that when it
// inlines them.
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<long> g_large_allocs{0};
constexpr std::size_t large = std::size_t{1} << 20;
void* counted_alloc(std::size_t n, std::size_t align) {
  if (n >= large) g_large_allocs.fetch_add(1, std::memory_order_relaxed);
  void* p =
      align <= alignof(std::max_align_t)
          ? std::malloc(n ? n : 1)
          : std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(std::size_t n) { return counted_alloc(n, 0); }
void* operator new[](std::size_t n) { return counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace cc = cairn::cuda;
using cc::testing::fake_runtime;

namespace {

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(seed) * 7) & 0xff);
  return v;
}
bool equal(std::span<const std::byte> a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace

TEST_SUITE("cuda stager") {
  TEST_CASE("host sources are copied by several threads, in pieces, before stage returns") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr);
    cc::stager st(pool, {.threads = 3, .piece_bytes = 4096, .use_device = false});
    CHECK_FALSE(st.device_enabled());
    std::vector<std::vector<std::byte>> src;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096},
                          std::size_t{100000}, std::size_t{3} << 20})
      src.push_back(pattern(n, static_cast<int>(src.size())));
    std::vector<cc::stage_item> items;
    for (auto& s : src) items.push_back({s.data(), s.size(), "host"});
    auto staged = st.stage(items);
    REQUIRE(staged);
    REQUIRE(staged->size() == src.size());
    auto expect = src;
    for (auto& s : src) std::fill(s.begin(), s.end(), std::byte{0xee});  // training goes on
    for (std::size_t i = 0; i < src.size(); ++i) {
      CHECK(equal((*staged)[i], expect[i]));
      CHECK(reinterpret_cast<std::uintptr_t>((*staged)[i].data()) % 64 == 0);
      if (!(*staged)[i].empty()) {
        CHECK((*staged)[i].data() >= pool.buffer().data());
        CHECK((*staged)[i].data() + (*staged)[i].size() <= pool.buffer().data() + pool.capacity());
      }
    }
    CHECK_FALSE(st.pending());
    CHECK(st.wait());
  }

  TEST_CASE("device sources are staged with memcpyAsync, wait() completes them") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.runtime = &fake.api()});
    REQUIRE(st.device_enabled());
    auto w1 = pattern(10000, 1), w2 = pattern(1 << 20, 2), h = pattern(5000, 3);
    void* d1 = fake.device_malloc(w1.size());
    void* d2 = fake.device_malloc(w2.size());
    fake.device_write(d1, w1.data(), w1.size());
    fake.device_write(d2, w2.data(), w2.size());
    CHECK(st.classify(d1) == cc::memory_kind::device);
    CHECK(st.classify(h.data()) == cc::memory_kind::host);

    std::vector<cc::stage_item> items{
        {d1, w1.size(), "w1"}, {h.data(), h.size(), "h"}, {d2, w2.size(), "w2"}};
    auto staged = st.stage(items);
    REQUIRE(staged);
    CHECK(st.pending());
    CHECK(equal((*staged)[1], h));      // host item: done at return
    CHECK(fake.pending_copies() == 2);  // device items: queued, not yet run
    CHECK_FALSE(equal((*staged)[0], w1));
    REQUIRE(st.wait());
    CHECK(equal((*staged)[0], w1));
    CHECK(equal((*staged)[2], w2));
    CHECK(fake.stats().d2h == 2);
    CHECK(pool.pinned());

    // Training overwrites the device tensors after wait(): the staged copy keeps the old bytes.
    auto junk = pattern(w2.size(), 9);
    fake.device_write(d1, junk.data(), w1.size());
    fake.device_write(d2, junk.data(), w2.size());
    fake.drain();
    CHECK(equal((*staged)[0], w1));
    CHECK(equal((*staged)[2], w2));
    CHECK(fake.misuse().empty());
    fake.device_free(d1);
    fake.device_free(d2);
  }

  TEST_CASE("device copies are ordered after work queued on the caller's stream") {
    fake_runtime fake;
    const auto& rt = fake.api();
    cc::staging_pool pool({}, &rt);
    cc::stager st(pool, {.runtime = &rt});
    auto before = pattern(4096, 1), after = pattern(4096, 2);
    void* d = fake.device_malloc(4096);
    fake.device_write(d, before.data(), before.size());
    cc::stream_t train = nullptr;
    REQUIRE(rt.stream_create(rt.self, &train) == 0);
    // The "optimizer step" writes the tensor on the training stream; not run yet.
    REQUIRE(rt.memcpy_async(rt.self, d, after.data(), 4096, cc::copy_kind::host_to_device, train) ==
            0);
    cc::stage_item item{d, 4096, "w"};
    auto staged = st.stage({&item, 1}, train);
    REQUIRE(staged);
    REQUIRE(st.wait());
    CHECK(equal((*staged)[0], after));
    REQUIRE(rt.stream_destroy(rt.self, train) == 0);
    CHECK(fake.misuse().empty());
    fake.device_free(d);
  }

  TEST_CASE("unstage copies staged bytes into device and host destinations") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.threads = 2, .piece_bytes = 1000, .runtime = &fake.api()});
    REQUIRE(pool.reserve(1 << 16));
    auto a = pattern(3000, 4), b = pattern(7000, 5);
    auto sa = pool.acquire(a.size()).value();
    auto sb = pool.acquire(b.size()).value();
    std::memcpy(sa.data(), a.data(), a.size());  // as if read from storage
    std::memcpy(sb.data(), b.data(), b.size());
    void* d = fake.device_malloc(a.size());
    std::vector<std::byte> host(b.size());
    std::vector<cc::unstage_item> items{{d, sa.data(), a.size(), "dev"},
                                        {host.data(), sb.data(), b.size(), "host"}};
    REQUIRE(st.unstage(items));
    CHECK(host == b);
    CHECK(fake.stats().h2d == 1);
    REQUIRE(st.wait());
    CHECK(fake.device_read(d, a.size()) == a);
    CHECK(fake.misuse().empty());
    fake.device_free(d);
  }

  TEST_CASE("a failed device copy is an error naming the key, nothing is left in flight") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.runtime = &fake.api()});
    void* d1 = fake.device_malloc(100);
    void* d2 = fake.device_malloc(100);
    fake.fail_memcpy(1, 700);
    std::vector<cc::stage_item> items{{d1, 100, "layer.0.w"}, {d2, 100, "layer.1.w"}};
    auto r = st.stage(items);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == cairn::errc::io);
    CHECK(r.err().key == "layer.1.w");
    CHECK(r.err().message.find("cudaMemcpyAsync: an illegal memory access was encountered") !=
          std::string::npos);
    CHECK(fake.pending_copies() == 0);
    fake.device_free(d1);
    fake.device_free(d2);
  }

  TEST_CASE("a bad item after device copies were enqueued leaves nothing in flight") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.runtime = &fake.api()});
    void* d = fake.device_malloc(100);
    std::vector<cc::stage_item> items{{d, 100, "ok"}, {nullptr, 100, "broken"}};
    auto r = st.stage(items);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "broken");
    CHECK(fake.pending_copies() == 0);
    CHECK_FALSE(st.pending());
    fake.device_free(d);
  }

  TEST_CASE("an asynchronous device fault surfaces at wait()") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.runtime = &fake.api()});
    void* d = fake.device_malloc(64);
    cc::stage_item item{d, 64, "w"};
    REQUIRE(st.stage({&item, 1}));
    fake.fail_next_sync(700);
    auto w = st.wait();
    REQUIRE_FALSE(w);
    CHECK(w.err().message.find("cudaEventSynchronize") != std::string::npos);
    CHECK(w.err().message.find("code 700") != std::string::npos);
    CHECK(st.wait());  // reported once
    fake.device_free(d);
  }

  TEST_CASE("without a usable device everything is host memory and no CUDA call is made") {
    fake_runtime fake;
    fake.fail_device_count(35);
    cc::staging_pool pool({}, &fake.api());
    cc::stager st(pool, {.runtime = &fake.api()});
    CHECK_FALSE(st.device_enabled());
    auto h = pattern(10000, 6);
    cc::stage_item item{h.data(), h.size(), "h"};
    auto staged = st.stage({&item, 1});
    REQUIRE(staged);
    CHECK(equal((*staged)[0], h));
    CHECK(fake.stats().pointer_queries == 0);
    CHECK(fake.stats().streams_created == 0);
    CHECK(fake.stats().host_allocs == 0);
  }

  TEST_CASE("empty items stage as empty spans, even into a pool never allocated") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr);
    cc::stager st(pool, {.use_device = false});
    std::vector<cc::stage_item> items{{nullptr, 0, "a"}, {nullptr, 0, "b"}};
    auto staged = st.stage(items);
    REQUIRE(staged);
    CHECK(staged->size() == 2);
    CHECK((*staged)[0].empty());
    CHECK(pool.capacity() == 0);
  }

  TEST_CASE("a pool already in use that is too small is an error, not a reallocation") {
    cc::aligned_host_resource mr;
    cc::staging_pool pool(mr, {.granularity = 4096});
    REQUIRE(pool.reserve(4096));
    REQUIRE(pool.acquire(10));
    cc::stager st(pool, {.use_device = false});
    auto h = pattern(8192, 1);
    cc::stage_item item{h.data(), h.size(), "big"};
    auto r = st.stage({&item, 1});
    REQUIRE_FALSE(r);
    CHECK(r.err().key == "big");
    CHECK(r.err().message.find("staging pool full") != std::string::npos);
  }

  TEST_CASE("the stager destroys its stream and events") {
    fake_runtime fake;
    void* d = fake.device_malloc(64);
    {
      cc::staging_pool pool({}, &fake.api());
      cc::stager st(pool, {.runtime = &fake.api()});
      cc::stage_item item{d, 64, "w"};
      REQUIRE(st.stage({&item, 1}));
      CHECK(fake.live_streams() == 1);
      CHECK(fake.pending_copies() == 1);  // the destructor waits for it
    }
    CHECK(fake.pending_copies() == 0);
    CHECK(fake.misuse().empty());
    fake.device_free(d);
    CHECK(fake.live_streams() == 0);
    CHECK(fake.live_events() == 0);
    CHECK(fake.live_pinned() == 0);
  }

  TEST_CASE("after the first save, saves allocate no staging memory and nothing >= 1 MiB") {
    fake_runtime fake;
    cc::testing::counting_resource counted;
    cc::staging_pool pool(counted);
    cc::stager st(pool, {.threads = 2, .piece_bytes = 1 << 20, .runtime = &fake.api()});
    std::vector<std::vector<std::byte>> host;
    std::vector<void*> dev;
    std::vector<cc::stage_item> items;
    for (int i = 0; i < 4; ++i) {
      host.push_back(pattern(std::size_t{3} << 20, i));
      dev.push_back(fake.device_malloc(std::size_t{2} << 20));
    }
    for (int i = 0; i < 4; ++i) {
      items.push_back({host[static_cast<std::size_t>(i)].data(),
                       host[static_cast<std::size_t>(i)].size(), "h"});
      items.push_back({dev[static_cast<std::size_t>(i)], std::size_t{2} << 20, "d"});
    }
    auto save = [&] {
      auto staged = st.stage(items);
      REQUIRE(staged);
      REQUIRE(st.wait());
      CHECK(equal((*staged)[0], host[0]));
      pool.reset();  // the save's writes are done
    };
    save();
    CHECK(counted.allocations() == 1);
    long before = g_large_allocs.load();
    for (int i = 0; i < 3; ++i) save();
    CHECK(g_large_allocs.load() == before);
    CHECK(counted.allocations() == 1);
    CHECK(fake.misuse().empty());
    for (void* d : dev) fake.device_free(d);
  }

  TEST_CASE("two stagers share one pool from two threads") {
    fake_runtime fake;
    cc::staging_pool pool({}, &fake.api());
    REQUIRE(pool.reserve(std::size_t{8} << 20));
    auto a = pattern(std::size_t{1} << 20, 1), b = pattern(std::size_t{1} << 20, 2);
    void* db = fake.device_malloc(b.size());
    fake.device_write(db, b.data(), b.size());
    std::vector<std::byte> got_a, got_b;
    std::thread t1([&] {
      cc::stager st(pool, {.threads = 2, .piece_bytes = 65536, .runtime = &fake.api()});
      cc::stage_item item{a.data(), a.size(), "a"};
      auto s = st.stage({&item, 1});
      if (s) got_a.assign((*s)[0].begin(), (*s)[0].end());
    });
    std::thread t2([&] {
      cc::stager st(pool, {.runtime = &fake.api()});
      cc::stage_item item{db, b.size(), "b"};
      auto s = st.stage({&item, 1});
      if (s && st.wait()) got_b.assign((*s)[0].begin(), (*s)[0].end());
    });
    t1.join();
    t2.join();
    CHECK(got_a == a);
    CHECK(got_b == b);
    fake.device_free(db);
  }
}
