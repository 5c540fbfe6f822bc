// cairn/storage/throttled-inl.hpp: the bodies of cairn/storage/throttled.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <thread>

#include "cairn/storage/throttled.hpp"

namespace cairn::detail {

CAIRN_INLINE void byte_pacer::pace(std::size_t n) {
  if (rate_ == 0 || n == 0) return;
  using clock = std::chrono::steady_clock;
  clock::time_point at;
  {
    std::lock_guard lock(mu_);
    auto now = clock::now();
    if (next_ < now) next_ = now;
    at = next_;
    next_ += std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(static_cast<double>(n) / static_cast<double>(rate_)));
  }
  std::this_thread::sleep_until(at);
}

CAIRN_INLINE result<void> throttled_writer::write_at(std::uint64_t offset,
                                                     std::span<const std::byte> data) {
  state_->writes.pace(data.size());
  return inner_->write_at(offset, data);
}

}  // namespace cairn::detail
