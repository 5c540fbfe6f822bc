// cairn/storage/buffer_pool-inl.hpp: the bodies of cairn/storage/buffer_pool.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/storage/buffer_pool.hpp"

namespace cairn {

CAIRN_INLINE std::unique_ptr<std::byte[]> buffer_pool::take() {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      auto b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  return std::unique_ptr<std::byte[]>(new std::byte[bytes_]);
}

CAIRN_INLINE void buffer_pool::give(std::unique_ptr<std::byte[]> b) {
  std::lock_guard lock(mu_);
  free_.push_back(std::move(b));
}

}  // namespace cairn
