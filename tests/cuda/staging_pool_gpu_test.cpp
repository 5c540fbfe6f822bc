// tests/cuda/gpu_test.cpp: the stager on a real GPU (device -> pinned host -> device). Exits
// with 77 (ctest: skipped) and says why when no usable device exists.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cairn/cairn.hpp"
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

  TEST_CASE("gpu: save and load of device tensors through a bounded staging window") {
    skip_without_gpu();
    constexpr std::int64_t rows = 4096, cols = 1024;  // 16 MiB of f32
    const std::size_t n = static_cast<std::size_t>(rows * cols) * 4;
    std::vector<float> host(static_cast<std::size_t>(rows * cols));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
    void* dev = nullptr;
    REQUIRE(cudaMalloc(&dev, n) == cudaSuccess);
    REQUIRE(cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(static_cast<float*>(dev), host.size()),
                                  {rows, cols}, 0));
    cairn::memory_storage mem;
    cairn::single_communicator one;
    cc::staging_pool pool;
    cairn::save_options so;
    so.staging = &pool;
    so.staging_window = std::size_t{2} << 20;
    so.index_files = false;  // format version 3: tiles gathered from device memory run by run
    cairn::save(sd, mem, one, so);
    CHECK(pool.capacity() <= so.staging_window);  // the window, not the 16 MiB state
    REQUIRE(cudaMemset(dev, 0, n) == cudaSuccess);
    cairn::load_options lo;
    lo.staging = &pool;
    cairn::load(sd, mem, one, lo);
    std::vector<float> check(host.size());
    REQUIRE(cudaMemcpy(check.data(), dev, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(check == host);
    cudaFree(dev);
  }
}
