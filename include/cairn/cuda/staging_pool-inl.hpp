// cairn/cuda/staging_pool-inl.hpp: the bodies of cairn/cuda/staging_pool.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cstring>

#include "cairn/cuda/staging_pool.hpp"

namespace cairn::cuda {

CAIRN_INLINE std::size_t staging_pool::bytes_for(std::span<const std::size_t> sizes,
                                                 std::size_t alignment) noexcept {
  std::size_t total = 0;
  for (std::size_t n : sizes) total += detail::align_up(n, alignment);
  return total;
}

CAIRN_INLINE result<void> staging_pool::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return ok();
  if (used() > 0)
    return make_error(errc::invalid_argument,
                      "staging pool: cannot grow from " + std::to_string(capacity_) + " to " +
                          std::to_string(bytes) + " bytes while " + std::to_string(used()) +
                          " bytes are acquired (reset() first)");
  std::size_t cap = detail::align_up(bytes, std::max<std::size_t>(opt_.granularity, page_size));
  release();
  try {
    base_ = static_cast<std::byte*>(mr_.allocate(cap, page_size));
  } catch (const exception& e) {
    return e.err();
  } catch (const std::exception& e) {
    return make_error(
        errc::io, "staging pool: allocating " + std::to_string(cap) + " bytes failed: " + e.what());
  }
  capacity_ = cap;
  ++allocations_;
  if (opt_.pre_touch) pre_touch();
  return ok();
}

CAIRN_INLINE std::byte* staging_pool::try_acquire(std::size_t bytes,
                                                  std::size_t alignment) noexcept {
  std::size_t cur = offset_.load(std::memory_order_relaxed);
  const auto base = reinterpret_cast<std::uintptr_t>(base_);
  for (;;) {
    std::size_t start = detail::align_up(base + cur, alignment) - base;
    if (start > capacity_ || bytes > capacity_ - start) return nullptr;
    if (offset_.compare_exchange_weak(cur, start + bytes, std::memory_order_relaxed))
      return base_ + start;
  }
}

CAIRN_INLINE result<std::span<std::byte>> staging_pool::acquire(std::size_t bytes,
                                                                std::size_t alignment) {
  std::byte* p = try_acquire(bytes, alignment);
  if (!p)
    return make_error(errc::invalid_argument,
                      "staging pool full: " + std::to_string(bytes) + " bytes requested, " +
                          std::to_string(used()) + " of " + std::to_string(capacity_) +
                          " used (reserve() the plan's bytes before staging)");
  return std::span<std::byte>(p, bytes);
}

CAIRN_INLINE void staging_pool::release() noexcept {
  if (base_) mr_.deallocate(base_, capacity_, page_size);
  base_ = nullptr;
  capacity_ = 0;
  offset_.store(0, std::memory_order_relaxed);
}

CAIRN_INLINE void staging_pool::pre_touch() {
  constexpr std::size_t piece = std::size_t{64} << 20;
  std::size_t pieces = (capacity_ + piece - 1) / piece;
  std::byte* base = base_;
  std::size_t cap = capacity_;
  (void)cairn::detail::run_parallel(pieces, opt_.touch_threads, [&](std::size_t i) {
    std::size_t end = std::min(cap, (i + 1) * piece);
    for (std::size_t off = i * piece; off < end; off += page_size)
      reinterpret_cast<volatile unsigned char*>(base)[off] = 0;
    return ok();
  });
}

CAIRN_INLINE stager::stager(staging_pool& pool, stager_options opt) : pool_(&pool), opt_(opt) {
  if (opt_.use_device) rt_ = usable_runtime(opt_.runtime);
  if (opt_.piece_bytes == 0) opt_.piece_bytes = std::size_t{8} << 20;
}

CAIRN_INLINE stager::~stager() {
  (void)wait();
  if (rt_) {
    if (done_) (void)rt_->event_destroy(rt_->self, done_);
    if (after_) (void)rt_->event_destroy(rt_->self, after_);
    if (stream_) (void)rt_->stream_destroy(rt_->self, stream_);
  }
}

CAIRN_INLINE memory_kind stager::classify(const void* p) const noexcept {
  if (!rt_ || !p || !rt_->pointer_get_attributes) return memory_kind::host;
  memory_type t = memory_type::unregistered;
  int dev = -1;
  if (rt_->pointer_get_attributes(rt_->self, p, &t, &dev) != 0) return memory_kind::host;
  return (t == memory_type::device || t == memory_type::managed) ? memory_kind::device
                                                                 : memory_kind::host;
}

CAIRN_INLINE result<std::span<const std::span<std::byte>>> stager::stage(
    std::span<const stage_item> items, stream_t after) {
  std::lock_guard lock(mu_);
  staged_.clear();
  pieces_.clear();
  std::size_t need = 0;
  for (const auto& it : items) need += detail::align_up(it.bytes, opt_.alignment);
  if (pool_->used() == 0) CAIRN_TRY(pool_->reserve(need));
  bool ordered = false;
  auto enqueue = [&]() -> result<void> {
    for (const auto& it : items) {
      if (it.bytes == 0) {  // nothing to copy; needs no pool space (the pool may be empty)
        staged_.emplace_back();
        continue;
      }
      auto span = pool_->acquire(it.bytes, opt_.alignment);
      if (!span) return std::move(span).err().with_key(std::string(it.key));
      std::byte* dst = span->data();
      staged_.emplace_back(dst, it.bytes);
      if (!it.src)
        return make_error(errc::invalid_argument, "stage: null source pointer")
            .with_key(std::string(it.key));
      if (classify(it.src) == memory_kind::device) {
        if (!ordered) {
          CAIRN_TRY(prepare_stream(after));
          ordered = true;
        }
        CAIRN_TRY(device_copy(dst, it.src, it.bytes, copy_kind::device_to_host, it.key));
      } else {
        add_pieces(dst, it.src, it.bytes);
      }
    }
    return ok();
  };
  result<void> enqueued = enqueue();  // sets `ordered`: call it before finish_enqueue
  CAIRN_TRY(finish_enqueue(std::move(enqueued), ordered));
  CAIRN_TRY(host_copies());
  return std::span<const std::span<std::byte>>(staged_);
}

CAIRN_INLINE result<void> stager::unstage(std::span<const unstage_item> items, stream_t after) {
  std::lock_guard lock(mu_);
  pieces_.clear();
  bool ordered = false;
  auto enqueue = [&]() -> result<void> {
    for (const auto& it : items) {
      if (it.bytes == 0) continue;
      if (!it.src || !it.dst)
        return make_error(errc::invalid_argument, "unstage: null pointer")
            .with_key(std::string(it.key));
      if (classify(it.dst) == memory_kind::device) {
        if (!ordered) {
          CAIRN_TRY(prepare_stream(after));
          ordered = true;
        }
        CAIRN_TRY(device_copy(it.dst, it.src, it.bytes, copy_kind::host_to_device, it.key));
      } else {
        add_pieces(it.dst, it.src, it.bytes);
      }
    }
    return ok();
  };
  result<void> enqueued = enqueue();  // sets `ordered`: call it before finish_enqueue
  CAIRN_TRY(finish_enqueue(std::move(enqueued), ordered));
  return host_copies();
}

CAIRN_INLINE result<void> stager::wait() {
  std::lock_guard lock(mu_);
  if (!pending_) return ok();
  pending_ = false;
  status s = rt_->event_synchronize(rt_->self, done_);
  if (s != 0) return make_error(errc::io, describe_status(*rt_, "cudaEventSynchronize", s));
  return ok();
}

CAIRN_INLINE bool stager::pending() const {
  std::lock_guard lock(mu_);
  return pending_;
}

CAIRN_INLINE void stager::add_pieces(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (std::size_t off = 0; off < bytes; off += opt_.piece_bytes)
    pieces_.push_back({d + off, s + off, std::min(opt_.piece_bytes, bytes - off)});
}

CAIRN_INLINE result<void> stager::host_copies() {
  return cairn::detail::run_parallel(pieces_.size(), opt_.threads, [this](std::size_t i) {
    const piece& p = pieces_[i];
    std::memcpy(p.dst, p.src, p.bytes);
    return ok();
  });
}

CAIRN_INLINE result<void> stager::cuda_call(const char* call, status s) {
  if (s == 0) return ok();
  return make_error(errc::io, describe_status(*rt_, call, s));
}

CAIRN_INLINE result<void> stager::prepare_stream(stream_t after) {
  if (!stream_) CAIRN_TRY(cuda_call("cudaStreamCreate", rt_->stream_create(rt_->self, &stream_)));
  if (!done_) CAIRN_TRY(cuda_call("cudaEventCreate", rt_->event_create(rt_->self, &done_)));
  if (after) {
    if (!after_) CAIRN_TRY(cuda_call("cudaEventCreate", rt_->event_create(rt_->self, &after_)));
    CAIRN_TRY(cuda_call("cudaEventRecord", rt_->event_record(rt_->self, after_, after)));
    CAIRN_TRY(cuda_call("cudaStreamWaitEvent", rt_->stream_wait_event(rt_->self, stream_, after_)));
  }
  return ok();
}

CAIRN_INLINE result<void> detail::copy_async(
    const runtime_api& rt, void* dst, const void* src, std::size_t bytes, copy_kind k, stream_t s) {
  status code = rt.memcpy_async(rt.self, dst, src, bytes, k, s);
  if (code == 0) return ok();
  std::string what = describe_status(rt, "cudaMemcpyAsync", code);
  what += k == copy_kind::device_to_host ? " (device to host, " : " (host to device, ";
  return make_error(errc::io, what + std::to_string(bytes) + " bytes)");
}

CAIRN_INLINE result<void> stager::device_copy(
    void* dst, const void* src, std::size_t bytes, copy_kind kind, std::string_view key) {
  auto r = detail::copy_async(*rt_, dst, src, bytes, kind, stream_);
  if (!r) return std::move(r).err().with_key(std::string(key));
  return ok();
}

CAIRN_INLINE result<void> stager::finish_enqueue(result<void> r, bool ordered) {
  if (!ordered) return r;
  if (!r) {
    (void)rt_->stream_synchronize(rt_->self, stream_);
    return r;
  }
  return record_done();
}

CAIRN_INLINE result<void> stager::record_done() {
  status s = rt_->event_record(rt_->self, done_, stream_);
  if (s != 0) {
    (void)rt_->stream_synchronize(rt_->self, stream_);
    return make_error(errc::io, describe_status(*rt_, "cudaEventRecord", s));
  }
  pending_ = true;
  return ok();
}

}  // namespace cairn::cuda
