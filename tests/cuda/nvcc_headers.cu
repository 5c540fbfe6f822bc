// tests/cuda/nvcc_headers.cu: cairn's core/ and cuda/ headers compile under nvcc (they must not
// pull fmt or simdjson, which nvcc 13 cannot parse) and work from a .cu file. Built with
// CAIRN_HAS_CUDA (cairn::cuda); prints "nvcc headers: ok" and exits 0.
#include <cairn/core/codec.hpp>
#include <cairn/core/common_value.hpp>
#include <cairn/core/dtype.hpp>
#include <cairn/core/error.hpp>
#include <cairn/core/local_non_persistent.hpp>
#include <cairn/core/sharded_object.hpp>
#include <cairn/core/sharded_tensor.hpp>
#include <cairn/cuda/memory_resource.hpp>
#include <cairn/cuda/runtime.hpp>
#include <cairn/cuda/staging_pool.hpp>
#include <cairn/cuda/testing/fake_runtime.hpp>
#include <cstdio>
#include <vector>

__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

int main() {
  std::vector<float> w(64, 1.5f);
  auto t = cairn::block<float>("w", w, {64}, {128}, {0});
  if (!cairn::validate_sharding(t, w.size())) return 1;
  // The device path, against the fake runtime, from a .cu translation unit.
  cairn::cuda::testing::fake_runtime fake;
  void* d = fake.device_malloc(w.size() * sizeof(float));
  fake.device_write(d, w.data(), w.size() * sizeof(float));
  cairn::cuda::staging_pool pool({}, &fake.api());
  cairn::cuda::stager st(pool, {.runtime = &fake.api()});
  cairn::cuda::stage_item item{d, w.size() * sizeof(float), "w"};
  auto staged = st.stage({&item, 1});
  if (!staged || !st.wait()) return 1;
  if (std::memcmp((*staged)[0].data(), w.data(), w.size() * sizeof(float)) != 0) return 1;
  fake.device_free(d);
  std::printf(
      "nvcc headers: ok (system device: %s)\n",
      cairn::cuda::system_device().usable ? "usable" : cairn::cuda::system_device().reason.c_str());
  return 0;
}
