// tests/cuda/gpu_test.cpp: the stager on a real GPU (device -> pinned host -> device). Exits
// with 77 (ctest: skipped) and says why when no usable device exists.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"

namespace cc = cairn::cuda;

namespace {
void skip_without_gpu() {
  if (cc::system_device().usable) return;
  MESSAGE("SKIPPED: no usable CUDA device (" << cc::system_device().reason << ")");
  std::printf("SKIPPED: no usable CUDA device (%s)\n", cc::system_device().reason.c_str());
  std::fflush(stdout);
  std::exit(77);
}
}  // namespace

TEST_SUITE("cuda gpu") {
  TEST_CASE("gpu: device tensors round-trip through the pinned staging pool") {
    skip_without_gpu();
    constexpr std::size_t n = std::size_t{16} << 20;
    std::vector<std::byte> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::byte>(i * 13);
    void* dev = nullptr;
    REQUIRE(cudaMalloc(&dev, n) == cudaSuccess);
    REQUIRE(cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
    cc::staging_pool pool;
    CHECK(pool.pinned());
    cc::stager st(pool);
    REQUIRE(st.device_enabled());
    CHECK(st.classify(dev) == cc::memory_kind::device);
    cc::stage_item item{dev, n, "w"};
    auto staged = st.stage({&item, 1});
    REQUIRE(staged);
    REQUIRE(st.wait());
    REQUIRE(cudaMemset(dev, 0, n) == cudaSuccess);  // training overwrites the tensor
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(std::memcmp((*staged)[0].data(), host.data(), n) == 0);
    cc::unstage_item back{dev, (*staged)[0].data(), n, "w"};
    REQUIRE(st.unstage({&back, 1}));
    REQUIRE(st.wait());
    std::vector<std::byte> check(n);
    REQUIRE(cudaMemcpy(check.data(), dev, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(check == host);
    cudaFree(dev);
  }
}
