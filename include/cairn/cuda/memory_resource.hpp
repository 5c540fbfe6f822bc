// cairn/cuda/memory_resource.hpp: host memory resources for staging, shaped like CCCL's
// `cuda::mr` resources: `allocate(bytes, alignment)`, `deallocate(p, bytes, alignment)
// noexcept`, `operator==`.
//
// - `aligned_host_resource`: aligned `operator new`; works everywhere (no CUDA needed).
// - `pinned_host_resource`: page-locked memory from cudaHostAlloc through a `runtime_api`.
// - `staging_memory_resource`: pinned when a usable device exists, aligned otherwise.
// - `host_resource_ref`: a non-owning type-erased reference to any of them.
//
// Uses the standard library only (plus <cuda_runtime_api.h> with CAIRN_HAS_CUDA, through
// runtime.hpp), so it compiles under nvcc.
#pragma once

#include <concepts>
#include <cstddef>
#include <mutex>
#include <string>
#include <type_traits>

#include "cairn/core/error.hpp"
#include "cairn/cuda/runtime.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::cuda {

/// The page size cairn assumes for pre-touching and alignment of staging buffers.
inline constexpr std::size_t page_size = 4096;

/// A host memory resource in the shape of `cuda::mr`: `allocate(bytes, alignment)` returns
/// memory or throws, `deallocate(p, bytes, alignment)` is noexcept and takes the same sizes,
/// and two resources compare equal when memory from one can be freed by the other.
template <class R>
concept host_memory_resource = requires(R& r, const R& cr, void* p, std::size_t n) {
  { r.allocate(n, n) } -> std::same_as<void*>;
  { r.deallocate(p, n, n) }
  noexcept;
  { cr == cr } -> std::convertible_to<bool>;
};

namespace detail {
CAIRN_INLINE void check_alignment(std::size_t alignment);
}  // namespace detail

/// Ordinary host memory from aligned `operator new`. Throws `std::bad_alloc` when out of memory
/// and `std::invalid_argument` for an alignment that is not a power of two. All instances are
/// equal. Needs no CUDA.
class aligned_host_resource {
 public:
  /// `bytes` of memory aligned to `alignment`.
  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t));
  /// Frees memory from `allocate` with the same `bytes` and `alignment`.
  void deallocate(void* p,
                  std::size_t bytes,
                  std::size_t alignment = alignof(std::max_align_t)) noexcept;
  /// False: ordinary pageable memory.
  static constexpr bool pinned() noexcept { return false; }
  friend bool operator==(const aligned_host_resource&, const aligned_host_resource&) noexcept {
    return true;
  }
};

/// Page-locked host memory from `cudaHostAlloc(…, cudaHostAllocPortable)` through a runtime
/// table; device copies to and from it run at full PCIe speed and truly asynchronously.
/// Allocations are page aligned; a larger alignment is rejected (`std::invalid_argument`).
/// A failed cudaHostAlloc throws `cairn::exception` (errc::io) with the runtime's message.
/// Pinning is slow (~1–2 GB/s): allocate once and reuse (see `staging_pool`).
class pinned_host_resource {
 public:
  /// Allocates through `rt`, which must outlive the resource.
  explicit pinned_host_resource(const runtime_api& rt) noexcept : rt_(&rt) {}

  /// `bytes` of page-locked memory aligned to `alignment` (at most `page_size`).
  void* allocate(std::size_t bytes, std::size_t alignment = page_size);
  /// Frees memory from `allocate` (cudaFreeHost).
  void deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/ = page_size) noexcept;
  /// True: page-locked memory.
  static constexpr bool pinned() noexcept { return true; }
  /// The runtime this resource allocates through.
  const runtime_api& runtime() const noexcept { return *rt_; }
  friend bool operator==(const pinned_host_resource& a, const pinned_host_resource& b) noexcept {
    return a.rt_ == b.rt_;
  }

 private:
  const runtime_api* rt_;
};

/// The staging memory cairn picks by itself: pinned memory when the runtime has a usable device,
/// aligned host memory otherwise (CUDA off, no driver, no device). When a pinned allocation
/// fails (say the OS limits locked memory), that allocation falls back to aligned memory too.
class staging_memory_resource {
 public:
  /// Chooses with `usable_runtime(rt)`: `rt` null means the default runtime (the real one with
  /// CAIRN_HAS_CUDA, probed once per process).
  explicit staging_memory_resource(const runtime_api* rt = nullptr);
  /// A resource that never uses CUDA.
  static staging_memory_resource host_only();

  /// Pinned memory when a device is usable (falling back to aligned memory if pinning fails),
  /// else aligned memory. Alignments above `page_size` always get aligned memory.
  void* allocate(std::size_t bytes, std::size_t alignment = page_size);
  /// Frees memory from `allocate`; asks the runtime whether `p` is pinned to pick the call.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = page_size) noexcept;
  /// Whether allocations try pinned memory (a usable device was found).
  bool pinned() const noexcept { return rt_ != nullptr; }
  /// How many pinned allocations failed and fell back to aligned memory.
  int pin_failures() const;
  /// One line saying which memory this resource hands out and why, e.g. "aligned host memory
  /// (cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version (code
  /// 35))".
  const std::string& describe() const noexcept { return why_; }
  /// The runtime used for pinned memory, or null (host only).
  const runtime_api* runtime() const noexcept { return rt_; }

  friend bool operator==(const staging_memory_resource& a,
                         const staging_memory_resource& b) noexcept {
    return a.rt_ == b.rt_;
  }

  staging_memory_resource(const staging_memory_resource& o)
      : rt_(o.rt_), why_(o.why_), pin_failures_(o.pin_failures()) {}
  staging_memory_resource& operator=(const staging_memory_resource& o);

 private:
  struct no_cuda_tag {};
  explicit staging_memory_resource(no_cuda_tag) : rt_(nullptr), why_("aligned host memory") {}

  bool is_pinned_pointer(void* p) const noexcept;

  const runtime_api* rt_ = nullptr;
  std::string why_;
  mutable std::mutex mu_;
  int pin_failures_ = 0;
};

/// A non-owning, type-erased reference to a `host_memory_resource` (like `cuda::mr`'s
/// `resource_ref`). The resource must outlive every reference to it.
class host_resource_ref {
 public:
  template <host_memory_resource R>
  requires(!std::same_as<std::remove_cvref_t<R>, host_resource_ref>) host_resource_ref(R& r)
  noexcept  // NOLINT(implicit): any resource converts
      : self_(&r), vt_(&vtable_for<R>) {}

  /// Forwards to the resource's `allocate`.
  void* allocate(std::size_t bytes, std::size_t alignment) {
    return vt_->allocate(self_, bytes, alignment);
  }
  /// Forwards to the resource's `deallocate`.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    vt_->deallocate(self_, p, bytes, alignment);
  }
  /// Whether the resource hands out page-locked memory (false when it does not say).
  bool pinned() const noexcept { return vt_->pinned(self_); }
  /// Equal when both refer to resources of the same type that compare equal.
  friend bool operator==(const host_resource_ref& a, const host_resource_ref& b) noexcept {
    return a.vt_ == b.vt_ && a.vt_->equal(a.self_, b.self_);
  }

 private:
  struct vtable {
    void* (*allocate)(void*, std::size_t, std::size_t);
    void (*deallocate)(void*, void*, std::size_t, std::size_t) noexcept;
    bool (*pinned)(const void*) noexcept;
    bool (*equal)(const void*, const void*) noexcept;
  };
  template <class R>
  static constexpr vtable vtable_for = {
      [](void* r, std::size_t n, std::size_t a) { return static_cast<R*>(r)->allocate(n, a); },
      [](void* r, void* p, std::size_t n, std::size_t a) noexcept {
        static_cast<R*>(r)->deallocate(p, n, a);
      },
      [](const void* r) noexcept -> bool {
        if constexpr (requires(const R& x) { x.pinned(); })
          return static_cast<const R*>(r)->pinned();
        else
          return false;
      },
      [](const void* a, const void* b) noexcept -> bool {
        return *static_cast<const R*>(a) == *static_cast<const R*>(b);
      },
  };
  void* self_;
  const vtable* vt_;
};

static_assert(host_memory_resource<aligned_host_resource>);
static_assert(host_memory_resource<pinned_host_resource>);
static_assert(host_memory_resource<staging_memory_resource>);
static_assert(host_memory_resource<host_resource_ref>);

}  // namespace cairn::cuda

#if CAIRN_HEADER_ONLY
#  include "cairn/cuda/memory_resource-inl.hpp"
#endif
