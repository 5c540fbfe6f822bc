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
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/cuda/memory_resource.hpp"
#include "cairn/cuda/runtime.hpp"
#include "cairn/detail/config.hpp"
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
                               std::size_t alignment = default_alignment) noexcept;

  /// Makes the capacity at least `bytes`. Allocates (and pre-touches) only when it grows; the
  /// old buffer is freed first. Growing while spans are acquired (`used() > 0`) is an error
  /// (errc::invalid_argument); a failed allocation is errc::io.
  result<void> reserve(std::size_t bytes);

  /// A span of `bytes` aligned to `alignment` (a power of two), or null when the pool is full.
  /// Thread-safe; never allocates.
  std::byte* try_acquire(std::size_t bytes, std::size_t alignment = default_alignment) noexcept;
  /// Like `try_acquire`, but a full pool is an error (errc::invalid_argument) naming the sizes.
  result<std::span<std::byte>> acquire(std::size_t bytes,
                                       std::size_t alignment = default_alignment);
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
  void release() noexcept;
  void pre_touch();

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

namespace detail {
/// Enqueues a copy of `bytes` bytes on stream `s` (cudaMemcpyAsync); a failure is an
/// errc::io error naming the call, the runtime's message, the direction and the size:
/// "cudaMemcpyAsync: ... (code 1) (device to host, 4096 bytes)".
CAIRN_INLINE result<void> copy_async(
    const runtime_api& rt, void* dst, const void* src, std::size_t bytes, copy_kind k, stream_t s);
}  // namespace detail

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
  explicit stager(staging_pool& pool, stager_options opt = {});
  stager(const stager&) = delete;
  stager& operator=(const stager&) = delete;
  /// Waits for pending device copies and destroys the stream and events.
  ~stager();

  /// Whether device copies are possible (a runtime with a usable device).
  bool device_enabled() const noexcept { return rt_ != nullptr; }
  /// The runtime used for device copies, or null.
  const runtime_api* runtime() const noexcept { return rt_; }

  /// Host or device, asking the runtime (always host without a usable device). Pointers the
  /// runtime does not know, or that it fails to describe, are host memory.
  memory_kind classify(const void* p) const noexcept;

  /// Copies every item into the pool and returns the staged bytes, one span per item in order
  /// (valid until the pool is reset or the next `stage`). When the pool has nothing acquired it
  /// is first grown to fit the items. Device copies are ordered after the work already queued
  /// on `after` (a stream of the caller's; null: only the legacy default stream's work) and are
  /// complete after `wait()`. Errors name the item's key.
  result<std::span<const std::span<std::byte>>> stage(std::span<const stage_item> items,
                                                      stream_t after = nullptr);

  /// Copies every item's staged bytes to its destination: host destinations before returning,
  /// device destinations (cudaMemcpyAsync host → device) complete after `wait()`. The sources
  /// must stay unchanged until then. Device copies are ordered after `after`'s queued work.
  result<void> unstage(std::span<const unstage_item> items, stream_t after = nullptr);

  /// Waits until every device copy enqueued by `stage`/`unstage` has finished. A device error
  /// (an asynchronous fault) is returned here as errc::io. Returns at once when none is pending.
  result<void> wait();

  /// Whether device copies were enqueued and not yet waited for.
  bool pending() const;

 private:
  struct piece {
    std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
  };

  void add_pieces(void* dst, const void* src, std::size_t bytes);

  result<void> host_copies();

  result<void> cuda_call(const char* call, status s);

  result<void> prepare_stream(stream_t after);

  result<void> device_copy(
      void* dst, const void* src, std::size_t bytes, copy_kind kind, std::string_view key);

  // After enqueueing: on success record the completion event; on failure make sure no copy
  // enqueued so far lands after the error is returned.
  result<void> finish_enqueue(result<void> r, bool ordered);

  result<void> record_done();

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

#if CAIRN_HEADER_ONLY
#  include "cairn/cuda/staging_pool-inl.hpp"
#endif
