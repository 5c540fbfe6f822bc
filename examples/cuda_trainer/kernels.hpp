// examples/cuda_trainer/kernels.hpp: the trainer's device side, as plain C++ declarations (no
// CUDA types), implemented in kernels.cu by nvcc. A real trainer's equivalent is its own CUDA
// code; cairn never needs to be included by a .cu file.
#pragma once

#include <cstddef>

namespace trainer {

/// Devices the CUDA runtime reports (0 when there is no device or no driver).
int device_count();
/// `bytes` of device memory, or null.
void* device_alloc(std::size_t bytes);
/// Frees device memory from `device_alloc`.
void device_free(void* p);
/// Copies host memory into device memory (synchronous); false on failure.
bool upload(void* dst, const void* src, std::size_t bytes);
/// Copies device memory into host memory (synchronous); false on failure.
bool download(void* dst, const void* src, std::size_t bytes);
/// One "optimizer step" on the device: w[i] -= lr * g(i, step); waits for the kernel.
bool sgd_step(float* w, int n, float lr, int step);

}  // namespace trainer
