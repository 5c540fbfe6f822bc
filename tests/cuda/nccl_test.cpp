// tests/cuda/nccl_test.cpp: nccl_communicator broadcast between device buffers, on one rank per
// visible GPU (thread ranks bootstrap it), out of place (so that it proves bytes moved on one
// GPU too) and in place. Exits with 77 (ctest: skipped) without a GPU.
#include "cairn/comm/nccl.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cairn/comm/threads.hpp"
#include "cairn/cuda/runtime.hpp"

TEST_SUITE("cuda nccl") {
  TEST_CASE("nccl: broadcast copies root's device buffer to every rank") {
    const auto& dev = cairn::cuda::system_device();
    if (!dev.usable) {
      MESSAGE("SKIPPED: no usable CUDA device (" << dev.reason << ")");
      std::printf("SKIPPED: no usable CUDA device (%s)\n", dev.reason.c_str());
      std::fflush(stdout);
      std::exit(77);
    }
    constexpr std::size_t n = 1 << 20;
    int world = dev.count;
    std::vector<int> ok(static_cast<std::size_t>(world), 0);
    cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
      auto nc = cairn::nccl_communicator::create(comm, comm.rank()).value();
      // Out of place: every rank's `recv` starts as zeros, the root's included, so that the
      // test fails on one GPU too unless the bytes actually moved; then in place.
      std::vector<unsigned char> host(n, static_cast<unsigned char>(comm.rank() == 0 ? 42 : 0));
      const std::vector<unsigned char> zeros(n, 0);
      void* send = nullptr;
      void* recv = nullptr;
      cudaStream_t s = nullptr;
      if (cudaMalloc(&send, n) != cudaSuccess || cudaMalloc(&recv, n) != cudaSuccess ||
          cudaStreamCreate(&s) != cudaSuccess)
        return;
      cudaMemcpy(send, host.data(), n, cudaMemcpyHostToDevice);
      cudaMemcpy(recv, zeros.data(), n, cudaMemcpyHostToDevice);
      if (!nc.broadcast(send, recv, n, 0, s)) return;
      cudaStreamSynchronize(s);
      std::vector<unsigned char> got(n, 0);
      cudaMemcpy(got.data(), recv, n, cudaMemcpyDeviceToHost);
      bool all = true;
      for (unsigned char c : got) all = all && c == 42;
      // In place: the non-root ranks' zeros become the root's 42s.
      if (!nc.broadcast(send, n, 0, s)) return;
      cudaStreamSynchronize(s);
      cudaMemcpy(got.data(), send, n, cudaMemcpyDeviceToHost);
      for (unsigned char c : got) all = all && c == 42;
      ok[static_cast<std::size_t>(comm.rank())] = all ? 1 : 0;
      cudaStreamDestroy(s);
      cudaFree(send);
      cudaFree(recv);
    });
    for (int r = 0; r < world; ++r) CHECK(ok[static_cast<std::size_t>(r)] == 1);
  }
}
