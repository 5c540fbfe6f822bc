// cairn/core/progress-inl.hpp: the bodies of cairn/core/progress.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/core/progress.hpp"

namespace cairn::detail {

CAIRN_INLINE progress_meter::progress_meter(const progress_callback* callback,
                                            std::string_view stage,
                                            std::uint64_t total,
                                            std::string_view object)
    : callback_(callback && *callback && total > 0 ? callback : nullptr),
      stage_(stage),
      object_(object),
      total_(total),
      step_(total / 1000 > 0 ? total / 1000 : 1) {
  if (callback_) (*callback_)({stage_, 0, total_, object_});
}

CAIRN_INLINE void progress_meter::add(std::uint64_t n) {
  if (!callback_ || n == 0) return;
  std::lock_guard lock(mu_);
  done_ = n >= total_ - done_ ? total_ : done_ + n;
  if (done_ < next_ && done_ < total_) return;
  next_ = done_ + step_;
  (*callback_)({stage_, done_, total_, object_});
}

CAIRN_INLINE void progress_meter::finish() {
  if (!callback_) return;
  std::lock_guard lock(mu_);
  if (done_ == total_) return;
  done_ = total_;
  (*callback_)({stage_, done_, total_, object_});
}

}  // namespace cairn::detail
