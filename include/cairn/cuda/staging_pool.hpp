// cairn/cuda/staging_pool.hpp: the staging pool (host memory allocated and pre-touched once,
// reused by every save) and the stager that copies host and device sources into it (saves) or
// out of it into host and device destinations (loads).
//
// Standard library only (plus the CUDA runtime header with CAIRN_HAS_CUDA): compiles under nvcc
// and in plain host builds, where every pointer is host memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/cuda/memory_resource.hpp"
#include "cairn/cuda/runtime.hpp"
#include "cairn/detail/parallel.hpp"

namespace cairn::cuda {

namespace detail {
constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept {
  return (n + a - 1) / a * a;
}
}  // namespace detail

/// How a `staging_pool` allocates.
struct staging_pool_options {
  /// Touch every page of a new buffer once, so the first save does not pay page faults
  /// (memcpy into fresh memory runs at ~2 GB/s against ~12 GB/s into touched memory).
  bool pre_touch = true;
  /// Threads that pre-touch a new buffer (the caller's thread is one of them).
  int touch_threads = 2;
  /// Capacity is rounded up to a multiple of this (bytes).
  std::size_t granularity = std::size_t{2} << 20;
};

/// Host staging memory sized from a byte count (what this rank stages in one save), allocated
/// and pre-touched once, and reused: `reserve(bytes)` allocates only when `bytes` exceeds the
/// capacity, so after the first save a steady-state save allocates nothing. Sub-spans are
/// handed out by a lock-free bump allocator (`acquire`, safe from many threads at once) and
/// all released together by `reset()`.
///
/// `reserve` and `reset` must not run concurrently with `acquire` or while acquired spans are
/// in use (e.g. by background writes of the previous save).
///
///     cairn::cuda::staging_pool pool;          // pinned when a device is usable
///     pool.reserve(plan_bytes).value();        // once; grows only if a later plan needs more
///     auto span = pool.acquire(n).value();     // from any thread
///     pool.reset();                            // when the save's writes are done
class staging_pool {
 public:
  /// A pool over its own `staging_memory_resource(runtime)`: pinned host memory when the
  /// runtime (null: the default runtime) has a usable device, aligned host memory otherwise.
  explicit staging_pool(staging_pool_options opt = {}, const runtime_api* runtime = nullptr)
      : owned_(std::in_place, runtime), mr_(*owned_), opt_(opt) {}
  /// A pool over `mr`, which must outlive the pool.
  explicit staging_pool(host_resource_ref mr, staging_pool_options opt = {}) : mr_(mr), opt_(opt) {}
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;
  ~staging_pool() { release(); }

  /// The bytes a pool needs so that spans of each of `sizes` can be acquired with `alignment`.
  static std::size_t bytes_for(std::span<const std::size_t> sizes,
                               std::size_t alignment = default_alignment) noexcept {
    std::size_t total = 0;
    for (std::size_t n : sizes) total += detail::align_up(n, alignment);
    return total;
  }

  /// Makes the capacity at least `bytes`. Allocates (and pre-touches) only when it grows; the
  /// old buffer is freed first. Growing while spans are acquired (`used() > 0`) is an error
  /// (errc::invalid_argument); a failed allocation is errc::io.
  result<void> reserve(std::size_t bytes) {
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
      return make_error(errc::io, "staging pool: allocating " + std::to_string(cap) +
                                      " bytes failed: " + e.what());
    }
    capacity_ = cap;
    ++allocations_;
    if (opt_.pre_touch) pre_touch();
    return ok();
  }

  /// A span of `bytes` aligned to `alignment` (a power of two), or null when the pool is full.
  /// Thread-safe; never allocates.
  std::byte* try_acquire(std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    std::size_t cur = offset_.load(std::memory_order_relaxed);
    const auto base = reinterpret_cast<std::uintptr_t>(base_);
    for (;;) {
      std::size_t start = detail::align_up(base + cur, alignment) - base;
      if (start > capacity_ || bytes > capacity_ - start) return nullptr;
      if (offset_.compare_exchange_weak(cur, start + bytes, std::memory_order_relaxed))
        return base_ + start;
    }
  }
  /// Like `try_acquire`, but a full pool is an error (errc::invalid_argument) naming the sizes.
  result<std::span<std::byte>> acquire(std::size_t bytes,
                                       std::size_t alignment = default_alignment) {
    std::byte* p = try_acquire(bytes, alignment);
    if (!p)
      return make_error(errc::invalid_argument,
                        "staging pool full: " + std::to_string(bytes) + " bytes requested, " +
                            std::to_string(used()) + " of " + std::to_string(capacity_) +
                            " used (reserve() the plan's bytes before staging)");
    return std::span<std::byte>(p, bytes);
  }
  /// Releases every acquired span at once (the memory stays allocated and touched).
  void reset() noexcept { offset_.store(0, std::memory_order_relaxed); }

  /// Bytes allocated.
  std::size_t capacity() const noexcept { return capacity_; }
  /// Bytes handed out since the last `reset()` (including alignment padding).
  std::size_t used() const noexcept {
    return std::min(offset_.load(std::memory_order_relaxed), capacity_);
  }
  /// How many buffers the pool has allocated in its life (1 after the first save when later
  /// saves fit).
  std::size_t allocations() const noexcept { return allocations_; }
  /// Whether the pool's memory is page-locked.
  bool pinned() const noexcept { return mr_.pinned(); }
  /// The whole buffer (empty before the first `reserve`).
  std::span<std::byte> buffer() const noexcept { return {base_, capacity_}; }
  /// One line saying what memory the pool uses and why, when it owns its resource.
  std::string describe() const {
    return owned_ ? owned_->describe() : (pinned() ? "pinned host memory" : "host memory");
  }

  /// The alignment `acquire` uses by default (bytes).
  static constexpr std::size_t default_alignment = 64;

 private:
  void release() noexcept {
    if (base_) mr_.deallocate(base_, capacity_, page_size);
    base_ = nullptr;
    capacity_ = 0;
    offset_.store(0, std::memory_order_relaxed);
  }
  void pre_touch() {
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

  std::optional<staging_memory_resource> owned_;
  host_resource_ref mr_;
  staging_pool_options opt_;
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::atomic<std::size_t> offset_{0};
  std::size_t allocations_ = 0;
};

/// Where a pointer points, as far as staging is concerned.
enum class memory_kind {
  host,    ///< host memory: copied with memcpy
  device,  ///< device (or managed) memory: copied with cudaMemcpyAsync
};

/// One source of a save: `bytes` at `src`, host or device memory. `key` names it in errors.
struct stage_item {
  const void* src = nullptr;
  std::size_t bytes = 0;
  std::string_view key = {};
};

/// One destination of a load: `bytes` from `src` (host memory, usually a pool span) into `dst`
/// (host or device memory). `key` names it in errors.
struct unstage_item {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  std::string_view key = {};
};

/// How a `stager` copies.
struct stager_options {
  /// Threads for host copies (the caller's thread is one of them).
  int threads = 2;
  /// Host copies are split into pieces of at most this many bytes, spread over the threads.
  std::size_t piece_bytes = std::size_t{8} << 20;
  /// Alignment of each staged span in the pool.
  std::size_t alignment = staging_pool::default_alignment;
  /// The CUDA runtime (null: the default one, i.e. the real runtime with CAIRN_HAS_CUDA). When
  /// it has no usable device, every pointer is treated as host memory.
  const runtime_api* runtime = nullptr;
  /// False: never use the device path, whatever the runtime says.
  bool use_device = true;
};

/// Copies a save's sources into a `staging_pool` and a load's staged bytes out to their
/// destinations. Host memory is copied by `threads` threads of memcpy; device memory (found
/// with cudaPointerGetAttributes, once per item per call) by cudaMemcpyAsync on the stager's
/// own stream, finished by `wait()` through an event.
///
/// - `stage(items)`: enqueues the device copies, copies host items before returning (so host
///   sources may change as soon as it returns), and returns one pool span per item. Device
///   sources may change once `wait()` returned.
/// - `unstage(items)`: the reverse; device destinations are complete after `wait()`.
///
/// One stage/unstage at a time per stager (calls are serialized); several stagers may share
/// one pool (reserve it first: `stage` grows only a pool with nothing acquired, and `reserve`
/// must not race with other stagers' `acquire`). After the first call with the largest item
/// list, calls allocate nothing.
class stager {
 public:
  /// A stager over `pool` (which must outlive it).
  explicit stager(staging_pool& pool, stager_options opt = {}) : pool_(&pool), opt_(opt) {
    if (opt_.use_device) rt_ = usable_runtime(opt_.runtime);
    if (opt_.piece_bytes == 0) opt_.piece_bytes = std::size_t{8} << 20;
  }
  stager(const stager&) = delete;
  stager& operator=(const stager&) = delete;
  /// Waits for pending device copies and destroys the stream and events.
  ~stager() {
    (void)wait();
    if (rt_) {
      if (done_) (void)rt_->event_destroy(rt_->self, done_);
      if (after_) (void)rt_->event_destroy(rt_->self, after_);
      if (stream_) (void)rt_->stream_destroy(rt_->self, stream_);
    }
  }

  /// Whether device copies are possible (a runtime with a usable device).
  bool device_enabled() const noexcept { return rt_ != nullptr; }
  /// The runtime used for device copies, or null.
  const runtime_api* runtime() const noexcept { return rt_; }

  /// Host or device, asking the runtime (always host without a usable device). Pointers the
  /// runtime does not know, or that it fails to describe, are host memory.
  memory_kind classify(const void* p) const noexcept {
    if (!rt_ || !p || !rt_->pointer_get_attributes) return memory_kind::host;
    memory_type t = memory_type::unregistered;
    int dev = -1;
    if (rt_->pointer_get_attributes(rt_->self, p, &t, &dev) != 0) return memory_kind::host;
    return (t == memory_type::device || t == memory_type::managed) ? memory_kind::device
                                                                   : memory_kind::host;
  }

  /// Copies every item into the pool and returns the staged bytes, one span per item in order
  /// (valid until the pool is reset or the next `stage`). When the pool has nothing acquired it
  /// is first grown to fit the items. Device copies are ordered after the work already queued
  /// on `after` (a stream of the caller's; null: only the legacy default stream's work) and are
  /// complete after `wait()`. Errors name the item's key.
  result<std::span<const std::span<std::byte>>> stage(std::span<const stage_item> items,
                                                      stream_t after = nullptr) {
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

  /// Copies every item's staged bytes to its destination: host destinations before returning,
  /// device destinations (cudaMemcpyAsync host → device) complete after `wait()`. The sources
  /// must stay unchanged until then. Device copies are ordered after `after`'s queued work.
  result<void> unstage(std::span<const unstage_item> items, stream_t after = nullptr) {
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

  /// Waits until every device copy enqueued by `stage`/`unstage` has finished. A device error
  /// (an asynchronous fault) is returned here as errc::io. Returns at once when none is pending.
  result<void> wait() {
    std::lock_guard lock(mu_);
    if (!pending_) return ok();
    pending_ = false;
    status s = rt_->event_synchronize(rt_->self, done_);
    if (s != 0) return make_error(errc::io, describe_status(*rt_, "cudaEventSynchronize", s));
    return ok();
  }

  /// Whether device copies were enqueued and not yet waited for.
  bool pending() const {
    std::lock_guard lock(mu_);
    return pending_;
  }

 private:
  struct piece {
    std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
  };

  void add_pieces(void* dst, const void* src, std::size_t bytes) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    for (std::size_t off = 0; off < bytes; off += opt_.piece_bytes)
      pieces_.push_back({d + off, s + off, std::min(opt_.piece_bytes, bytes - off)});
  }

  result<void> host_copies() {
    return cairn::detail::run_parallel(pieces_.size(), opt_.threads, [this](std::size_t i) {
      const piece& p = pieces_[i];
      std::memcpy(p.dst, p.src, p.bytes);
      return ok();
    });
  }

  result<void> cuda_call(const char* call, status s) {
    if (s == 0) return ok();
    return make_error(errc::io, describe_status(*rt_, call, s));
  }

  result<void> prepare_stream(stream_t after) {
    if (!stream_) CAIRN_TRY(cuda_call("cudaStreamCreate", rt_->stream_create(rt_->self, &stream_)));
    if (!done_) CAIRN_TRY(cuda_call("cudaEventCreate", rt_->event_create(rt_->self, &done_)));
    if (after) {
      if (!after_) CAIRN_TRY(cuda_call("cudaEventCreate", rt_->event_create(rt_->self, &after_)));
      CAIRN_TRY(cuda_call("cudaEventRecord", rt_->event_record(rt_->self, after_, after)));
      CAIRN_TRY(
          cuda_call("cudaStreamWaitEvent", rt_->stream_wait_event(rt_->self, stream_, after_)));
    }
    return ok();
  }

  result<void> device_copy(
      void* dst, const void* src, std::size_t bytes, copy_kind kind, std::string_view key) {
    status s = rt_->memcpy_async(rt_->self, dst, src, bytes, kind, stream_);
    if (s == 0) return ok();
    std::string what = describe_status(*rt_, "cudaMemcpyAsync", s);
    what += kind == copy_kind::device_to_host ? " (device to host, " : " (host to device, ";
    what += std::to_string(bytes) + " bytes)";
    return make_error(errc::io, std::move(what)).with_key(std::string(key));
  }

  // After enqueueing: on success record the completion event; on failure make sure no copy
  // enqueued so far lands after the error is returned.
  result<void> finish_enqueue(result<void> r, bool ordered) {
    if (!ordered) return r;
    if (!r) {
      (void)rt_->stream_synchronize(rt_->self, stream_);
      return r;
    }
    return record_done();
  }

  result<void> record_done() {
    status s = rt_->event_record(rt_->self, done_, stream_);
    if (s != 0) {
      (void)rt_->stream_synchronize(rt_->self, stream_);
      return make_error(errc::io, describe_status(*rt_, "cudaEventRecord", s));
    }
    pending_ = true;
    return ok();
  }

  staging_pool* pool_;
  stager_options opt_;
  const runtime_api* rt_ = nullptr;
  stream_t stream_ = nullptr;
  event_t done_ = nullptr;
  event_t after_ = nullptr;
  bool pending_ = false;
  mutable std::mutex mu_;
  std::vector<std::span<std::byte>> staged_;
  std::vector<piece> pieces_;
};

}  // namespace cairn::cuda
