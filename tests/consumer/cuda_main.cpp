// A consumer of cairn::cuda: stages a host buffer through the pool (falls back to host memory
// without a GPU) and prints what it used.
#include <cairn/cuda/staging_pool.hpp>
#include <cstdio>
#include <vector>

int main() {
  cairn::cuda::staging_pool pool;
  cairn::cuda::stager st(pool);
  std::vector<std::byte> src(1000, std::byte{1});
  cairn::cuda::stage_item item{src.data(), src.size(), "x"};
  auto staged = st.stage({&item, 1});
  if (!staged || !st.wait() || (*staged)[0][999] != std::byte{1}) return 1;
  std::printf("cairn::cuda consumer: %s\n", pool.describe().c_str());
  return 0;
}
