// cairn/cuda/staging_window-inl.hpp: the bodies of cairn/cuda/staging_window.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "cairn/cuda/staging_window.hpp"

namespace cairn::cuda {

CAIRN_INLINE result<std::unique_ptr<staging_window>> staging_window::open(staging_pool& pool,
                                                                          const runtime_api& rt,
                                                                          std::size_t piece_bytes,
                                                                          std::size_t slots) {
  if (piece_bytes == 0 || slots == 0)
    return make_error(errc::invalid_argument, "staging window: " + std::to_string(slots) +
                                                  " slots of " + std::to_string(piece_bytes) +
                                                  " bytes");
  if (pool.used() > 0)
    return make_error(errc::invalid_argument,
                      "the staging pool is in use (" + std::to_string(pool.used()) +
                          " bytes acquired: an async save through it still in flight?)");
  const std::size_t each = detail::align_up(piece_bytes, staging_pool::default_alignment);
  CAIRN_TRY(pool.reserve(each * slots));
  std::unique_ptr<staging_window> w(new staging_window(rt, piece_bytes));
  w->free_.reserve(slots);
  for (std::size_t i = 0; i < slots; ++i) {
    CAIRN_TRY_ASSIGN(auto span, pool.acquire(piece_bytes));
    w->memory_.push_back(span);
    w->streams_.push_back(nullptr);
    status s = rt.stream_create(rt.self, &w->streams_.back());
    if (s != 0) {
      w->streams_.pop_back();
      return make_error(errc::io, describe_status(rt, "cudaStreamCreate", s));
    }
    w->free_.push_back(slots - 1 - i);  // taken from the back: slot 0 first
  }
  return w;
}

CAIRN_INLINE staging_window::~staging_window() {
  for (stream_t s : streams_) {
    (void)rt_->stream_synchronize(rt_->self, s);
    (void)rt_->stream_destroy(rt_->self, s);
  }
}

CAIRN_INLINE staging_window::slot staging_window::take() {
  std::unique_lock lock(mu_);
  freed_.wait(lock, [&] { return !free_.empty(); });
  std::size_t i = free_.back();
  free_.pop_back();
  peak_ = std::max(peak_, ++taken_);
  return slot(*this, i);
}

CAIRN_INLINE std::size_t staging_window::peak_slots() const {
  std::lock_guard lock(mu_);
  return peak_;
}

CAIRN_INLINE void staging_window::give_back(std::size_t index) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(index);
    --taken_;
  }
  freed_.notify_one();
}

CAIRN_INLINE result<void> staging_window::copy(
    std::size_t index, std::size_t at, const void* device, std::size_t n, copy_kind k) {
  if (at > piece_ || n > piece_ - at)
    return make_error(errc::invalid_argument,
                      "staging window: " + std::to_string(n) + " bytes at " + std::to_string(at) +
                          " do not fit a slot of " + std::to_string(piece_));
  if (n == 0) return ok();
  std::byte* host = memory_[index].data() + at;
  const bool down = k == copy_kind::device_to_host;
  void* dst = down ? static_cast<void*>(host) : const_cast<void*>(device);
  const void* src = down ? device : static_cast<const void*>(host);
  return detail::copy_async(*rt_, dst, src, n, k, streams_[index]);
}

CAIRN_INLINE staging_window::slot::~slot() {
  if (!w_) return;
  (void)wait();
  w_->give_back(index_);
}

CAIRN_INLINE std::span<std::byte> staging_window::slot::bytes() const noexcept {
  return w_->memory_[index_];
}

CAIRN_INLINE result<void> staging_window::slot::from_device(std::size_t at,
                                                            const void* src,
                                                            std::size_t n) {
  return w_->copy(index_, at, src, n, copy_kind::device_to_host);
}

CAIRN_INLINE result<void> staging_window::slot::to_device(void* dst,
                                                          std::size_t at,
                                                          std::size_t n) {
  return w_->copy(index_, at, dst, n, copy_kind::host_to_device);
}

CAIRN_INLINE result<void> staging_window::slot::wait() {
  const runtime_api& rt = *w_->rt_;
  status s = rt.stream_synchronize(rt.self, w_->streams_[index_]);
  if (s != 0) return make_error(errc::io, describe_status(rt, "cudaStreamSynchronize", s));
  return ok();
}

CAIRN_INLINE result<staging_window::slot*> window_mover::drained() {
  if (!slot_) {
    slot_.emplace(w_->take());
  } else if (used_ > 0) {
    CAIRN_TRY(slot_->wait());
  }
  used_ = 0;
  return &*slot_;
}

CAIRN_INLINE result<void> window_mover::put(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  while (n > 0) {
    if (!slot_ || used_ == w_->piece_bytes()) CAIRN_TRY(drained());
    const std::size_t k = std::min(n, w_->piece_bytes() - used_);
    std::memcpy(slot_->bytes().data() + used_, s, k);
    CAIRN_TRY(slot_->to_device(d, used_, k));
    used_ += k;
    d += k;
    s += k;
    n -= k;
  }
  return ok();
}

CAIRN_INLINE result<void> window_mover::get(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  CAIRN_TRY_ASSIGN(staging_window::slot * slot, drained());
  while (n > 0) {
    const std::size_t k = std::min(n, w_->piece_bytes());
    CAIRN_TRY(slot->from_device(0, s, k));
    CAIRN_TRY(slot->wait());
    std::memcpy(d, slot->bytes().data(), k);
    d += k;
    s += k;
    n -= k;
  }
  return ok();
}

CAIRN_INLINE result<void> window_mover::flush() {
  if (!slot_) return ok();
  result<void> r = used_ > 0 ? slot_->wait() : ok();
  used_ = 0;
  slot_.reset();
  return r;
}

}  // namespace cairn::cuda
