// examples/cuda_trainer/kernels.cu: the trainer's kernels, compiled by nvcc. Includes only the
// CUDA runtime and kernels.hpp: the .cu side of a trainer never needs cairn's headers.
#include <cuda_runtime.h>

#include "kernels.hpp"

namespace {

__global__ void sgd_kernel(float* w, int n, float lr, int step) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] -= lr * __sinf(0.001f * static_cast<float>(i) + static_cast<float>(step));
}

}  // namespace

namespace trainer {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
}

void device_free(void* p) { cudaFree(p); }

bool upload(void* dst, const void* src, std::size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
}

bool download(void* dst, const void* src, std::size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
}

bool sgd_step(float* w, int n, float lr, int step) {
  sgd_kernel<<<(n + 255) / 256, 256>>>(w, n, lr, step);
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

}  // namespace trainer
