// tests/cuda/memory_resource_test.cpp: the host memory resources (aligned, pinned through a
// runtime table, the automatic staging choice) and host_resource_ref, against the fake runtime.
#include "cairn/cuda/memory_resource.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "cairn/cuda/testing/fake_runtime.hpp"

namespace cc = cairn::cuda;
using cc::testing::fake_runtime;

namespace {
bool aligned_to(const void* p, std::size_t a) {
  return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}
}  // namespace

TEST_SUITE("cuda memory resources") {
  TEST_CASE("aligned_host_resource honours alignment, frees, and rejects bad alignments") {
    cc::aligned_host_resource r;
    for (std::size_t a : {8u, 64u, 4096u, 65536u}) {
      void* p = r.allocate(1000, a);
      CHECK(aligned_to(p, a));
      std::memset(p, 0xab, 1000);  // writable host memory
      r.deallocate(p, 1000, a);
    }
    CHECK_THROWS_AS((void)r.allocate(10, 3), std::invalid_argument);
    CHECK(r == cc::aligned_host_resource{});
    CHECK_FALSE(r.pinned());
  }

  TEST_CASE("pinned_host_resource allocates and frees through the runtime table") {
    fake_runtime fake;
    cc::pinned_host_resource r(fake.api());
    void* p = r.allocate(1 << 20);
    CHECK(aligned_to(p, cc::page_size));
    CHECK(fake.live_pinned() == 1);
    std::memset(p, 1, 1 << 20);
    r.deallocate(p, 1 << 20);
    CHECK(fake.live_pinned() == 0);
    CHECK(fake.stats().host_allocs == 1);
    CHECK(fake.stats().host_frees == 1);
    CHECK_THROWS_AS((void)r.allocate(10, 2 * cc::page_size), std::invalid_argument);
    CHECK(r == cc::pinned_host_resource(fake.api()));
    fake_runtime other;
    CHECK_FALSE(r == cc::pinned_host_resource(other.api()));
    CHECK(fake.misuse().empty());
  }

  TEST_CASE("a failed cudaHostAlloc throws cairn::exception with the runtime's message") {
    fake_runtime fake;
    fake.fail_host_alloc(2);
    cc::pinned_host_resource r(fake.api());
    try {
      (void)r.allocate(4096);
      FAIL("no exception");
    } catch (const cairn::exception& e) {
      CHECK(e.err().code == cairn::errc::io);
      CHECK(e.err().message.find("cudaHostAlloc: out of memory (code 2)") != std::string::npos);
    }
  }

  TEST_CASE("staging_memory_resource picks pinned memory when the runtime has a device") {
    fake_runtime fake;
    cc::staging_memory_resource r(&fake.api());
    CHECK(r.pinned());
    CHECK(r.describe().find("pinned") != std::string::npos);
    void* p = r.allocate(8192);
    CHECK(fake.live_pinned() == 1);
    r.deallocate(p, 8192);
    CHECK(fake.live_pinned() == 0);
    CHECK(fake.misuse().empty());
  }

  TEST_CASE("staging_memory_resource falls back to aligned memory without a usable device") {
    SUBCASE("no driver (error 35)") {
      fake_runtime fake;
      fake.fail_device_count(35);
      cc::staging_memory_resource r(&fake.api());
      CHECK_FALSE(r.pinned());
      CHECK(r.describe().find("code 35") != std::string::npos);
      void* p = r.allocate(8192);
      std::memset(p, 0, 8192);
      r.deallocate(p, 8192);
      CHECK(fake.stats().host_allocs == 0);
    }
    SUBCASE("zero devices") {
      fake_runtime fake(0);
      cc::staging_memory_resource r(&fake.api());
      CHECK_FALSE(r.pinned());
      CHECK(r.describe().find("no CUDA-capable device") != std::string::npos);
    }
    SUBCASE("host_only") {
      auto r = cc::staging_memory_resource::host_only();
      CHECK_FALSE(r.pinned());
      CHECK(r.runtime() == nullptr);
    }
  }

  TEST_CASE("a pinned allocation that fails falls back to aligned memory and frees correctly") {
    fake_runtime fake;
    cc::staging_memory_resource r(&fake.api());
    void* pinned = r.allocate(4096);
    fake.fail_host_alloc(2);
    void* plain = r.allocate(4096);
    CHECK(r.pin_failures() == 1);
    CHECK(fake.live_pinned() == 1);
    std::memset(plain, 0, 4096);
    r.deallocate(plain, 4096);  // must not go to cudaFreeHost
    r.deallocate(pinned, 4096);
    CHECK(fake.live_pinned() == 0);
    CHECK(fake.misuse().empty());
  }

  TEST_CASE("host_resource_ref forwards to the resource and compares its target") {
    fake_runtime fake;
    cc::pinned_host_resource pinned(fake.api());
    cc::aligned_host_resource aligned;
    cc::host_resource_ref a(pinned), b(aligned), c(pinned);
    CHECK(a.pinned());
    CHECK_FALSE(b.pinned());
    CHECK(a == c);
    CHECK_FALSE(a == b);
    void* p = a.allocate(100, 64);
    CHECK(fake.live_pinned() == 1);
    a.deallocate(p, 100, 64);
    CHECK(fake.live_pinned() == 0);
  }
}
