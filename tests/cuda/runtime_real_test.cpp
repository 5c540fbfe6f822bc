// tests/cuda/real_runtime_test.cpp: the cuda/ headers with CAIRN_HAS_CUDA against the real
// runtime. On a machine without a usable GPU (here every call returns 35), detection says so
// once, pinned staging falls back to aligned host memory, and staging host data works; on a GPU
// machine the same tests check the pinned path.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "cairn/cuda/memory_resource.hpp"
#include "cairn/cuda/runtime.hpp"
#include "cairn/cuda/staging_pool.hpp"

#ifndef CAIRN_HAS_CUDA
#  error "test_cuda_real must be built against cairn::cuda"
#endif

namespace cc = cairn::cuda;

TEST_SUITE("cuda real runtime") {
  TEST_CASE("real runtime: device detection runs once and explains a missing device") {
    REQUIRE(cc::default_runtime() == &cc::real_runtime());
    const auto& d = cc::system_device();
    CHECK(&d == &cc::system_device());
    MESSAGE("system_device: usable=" << d.usable << " count=" << d.count << " reason='" << d.reason
                                     << "'");
    if (!d.usable) {
      CHECK_FALSE(d.reason.empty());
      CHECK(d.code != 0);
      CHECK(cc::usable_runtime() == nullptr);
    } else {
      CHECK(d.count > 0);
      CHECK(cc::usable_runtime() == &cc::real_runtime());
    }
    const auto& rt = cc::real_runtime();
    CHECK(std::strlen(rt.get_error_string(rt.self, 35)) > 0);
  }

  TEST_CASE("real runtime: the default staging resource and pool fall back cleanly") {
    cc::staging_memory_resource mr;
    CHECK(mr.pinned() == cc::system_device().usable);
    MESSAGE("staging memory: " << mr.describe());
    cc::staging_pool pool;
    REQUIRE(pool.reserve(1 << 20));
    CHECK(pool.pinned() == cc::system_device().usable);
    cc::stager st(pool);
    CHECK(st.device_enabled() == cc::system_device().usable);
    std::vector<std::byte> src(300000, std::byte{7});
    cc::stage_item item{src.data(), src.size(), "host"};
    auto staged = st.stage({&item, 1});
    REQUIRE(staged);
    REQUIRE(st.wait());
    CHECK(std::memcmp((*staged)[0].data(), src.data(), src.size()) == 0);
  }

  TEST_CASE("real runtime: pinned_host_resource reports cudaHostAlloc's failure as an error") {
    cc::pinned_host_resource r(cc::real_runtime());
    if (cc::system_device().usable) {
      void* p = r.allocate(4096);
      r.deallocate(p, 4096);
    } else {
      CHECK_THROWS_AS((void)r.allocate(4096), cairn::exception);
    }
  }
}
