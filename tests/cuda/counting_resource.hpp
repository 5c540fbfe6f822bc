// tests/cuda/counting_resource.hpp: a host memory resource that counts its allocations, for
// tests that prove the staging pool allocates once.
#pragma once

#include <atomic>
#include <cstddef>

#include "cairn/cuda/memory_resource.hpp"

namespace cairn::cuda::testing {

/// Aligned host memory, counting calls to `allocate` and live allocations.
class counting_resource {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) {
    ++allocations_;
    ++live_;
    return aligned_host_resource().allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    --live_;
    aligned_host_resource().deallocate(p, bytes, alignment);
  }
  int allocations() const noexcept { return allocations_; }
  int live() const noexcept { return live_; }
  friend bool operator==(const counting_resource& a, const counting_resource& b) noexcept {
    return &a == &b;
  }

 private:
  std::atomic<int> allocations_{0};
  std::atomic<int> live_{0};
};

}  // namespace cairn::cuda::testing
