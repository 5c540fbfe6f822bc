// cairn/cuda/memory_resource-inl.hpp: the bodies of cairn/cuda/memory_resource.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <new>
#include <stdexcept>

#include "cairn/core/error.hpp"
#include "cairn/cuda/memory_resource.hpp"

namespace cairn::cuda::detail {

CAIRN_INLINE void check_alignment(std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument("cairn: memory resource alignment " + std::to_string(alignment) +
                                " is not a power of two");
}

}  // namespace cairn::cuda::detail

namespace cairn::cuda {

CAIRN_INLINE void* aligned_host_resource::allocate(std::size_t bytes, std::size_t alignment) {
  detail::check_alignment(alignment);
  return ::operator new (bytes, std::align_val_t{alignment});
}

CAIRN_INLINE void aligned_host_resource::deallocate(void* p,
                                                    std::size_t bytes,
                                                    std::size_t alignment) noexcept {
#if defined(__cpp_sized_deallocation)
  ::operator delete (p, bytes, std::align_val_t{alignment});
#else  // clang before 19 declares the sized forms only with -fsized-deallocation
  (void)bytes;
  ::operator delete (p, std::align_val_t{alignment});
#endif
}

CAIRN_INLINE void* pinned_host_resource::allocate(std::size_t bytes, std::size_t alignment) {
  detail::check_alignment(alignment);
  if (alignment > page_size)
    throw std::invalid_argument("cairn: pinned_host_resource supports alignments up to " +
                                std::to_string(page_size));
  void* p = nullptr;
  status s = rt_->host_alloc ? rt_->host_alloc(rt_->self, &p, bytes) : 1;
  if (s != 0 || !p)
    throw exception(make_error(errc::io, describe_status(*rt_, "cudaHostAlloc", s) + " for " +
                                             std::to_string(bytes) + " bytes"));
  return p;
}

CAIRN_INLINE void pinned_host_resource::deallocate(void* p,
                                                   std::size_t /*bytes*/,
                                                   std::size_t /*alignment*/) noexcept {
  if (p && rt_->free_host) (void)rt_->free_host(rt_->self, p);
}

CAIRN_INLINE staging_memory_resource::staging_memory_resource(const runtime_api* rt)
    : rt_(usable_runtime(rt)) {
  if (rt_) {
    why_ = "pinned host memory (cudaHostAlloc)";
  } else if (rt) {
    why_ = "aligned host memory (" + probe(*rt).reason + ")";
  } else {
    why_ = "aligned host memory (" + system_device().reason + ")";
  }
}

CAIRN_INLINE staging_memory_resource staging_memory_resource::host_only() {
  staging_memory_resource r{no_cuda_tag{}};
  return r;
}

CAIRN_INLINE void* staging_memory_resource::allocate(std::size_t bytes, std::size_t alignment) {
  if (rt_ && alignment <= page_size) {
    try {
      return pinned_host_resource(*rt_).allocate(bytes, alignment);
    } catch (const exception&) {
      std::lock_guard lock(mu_);
      ++pin_failures_;
    }
  }
  return aligned_host_resource().allocate(bytes, alignment);
}

CAIRN_INLINE void staging_memory_resource::deallocate(void* p,
                                                      std::size_t bytes,
                                                      std::size_t alignment) noexcept {
  if (!p) return;
  if (rt_ && alignment <= page_size && is_pinned_pointer(p)) {
    pinned_host_resource(*rt_).deallocate(p, bytes, alignment);
    return;
  }
  aligned_host_resource().deallocate(p, bytes, alignment);
}

CAIRN_INLINE int staging_memory_resource::pin_failures() const {
  std::lock_guard lock(mu_);
  return pin_failures_;
}

CAIRN_INLINE staging_memory_resource& staging_memory_resource::operator=(
    const staging_memory_resource& o) {
  if (this != &o) {
    rt_ = o.rt_;
    why_ = o.why_;
    pin_failures_ = o.pin_failures();
  }
  return *this;
}

CAIRN_INLINE bool staging_memory_resource::is_pinned_pointer(void* p) const noexcept {
  if (!rt_->pointer_get_attributes) return true;
  memory_type t = memory_type::unregistered;
  int dev = -1;
  return rt_->pointer_get_attributes(rt_->self, p, &t, &dev) == 0 && t == memory_type::host;
}

}  // namespace cairn::cuda
