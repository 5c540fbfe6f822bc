// cairn/storage/buffer_pool.hpp: reusable host buffers for the copies that cannot go straight
// between user memory and storage (gathering tiles on save, partial blocks on load).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "cairn/detail/config.hpp"

namespace cairn {

/// Buffers of one size, reused across writes and reads (and across saves when the owner keeps
/// the pool: fresh memory costs a page fault per 4 KiB, and async saves must not allocate).
/// Thread-safe. A strategy's `write` receives one; `async_saver` keeps one for its lifetime.
class buffer_pool {
 public:
  /// Buffers of `bytes` each.
  explicit buffer_pool(std::size_t bytes = std::size_t{8} << 20) : bytes_(bytes) {}
  /// Size of each buffer.
  std::size_t size() const noexcept { return bytes_; }
  /// A buffer of `size()` bytes (not zeroed), reused when one is free.
  std::unique_ptr<std::byte[]> take();
  /// Returns a buffer taken with `take()`.
  void give(std::unique_ptr<std::byte[]> b);

 private:
  std::size_t bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<std::byte[]>> free_;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/buffer_pool-inl.hpp"
#endif
