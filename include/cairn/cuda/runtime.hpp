// cairn/cuda/runtime.hpp: the few CUDA runtime calls cairn makes, behind a table of function
// pointers (`runtime_api`), so staging code runs against the real runtime, a test double
// (cuda/testing/fake_runtime.hpp) or no runtime at all.
//
// Without CAIRN_HAS_CUDA (defined by the cairn::cuda CMake target) this header uses the standard
// library only: plain host builds and nvcc both compile it. With it, `real_runtime()` wraps
// libcudart (<cuda_runtime_api.h>, linked through CUDA::cudart).
#pragma once

#include <cstddef>
#include <string>

#ifdef CAIRN_HAS_CUDA
#  include <cuda_runtime_api.h>
#endif

namespace cairn::cuda {

/// A CUDA runtime status: 0 is success; other values are `cudaError_t` codes (35: no usable
/// driver, 100: no device).
using status = int;

/// An opaque stream handle (a `cudaStream_t` for the real runtime).
using stream_t = void*;
/// An opaque event handle (a `cudaEvent_t` for the real runtime).
using event_t = void*;

/// Copy direction; the values are those of `cudaMemcpyKind`.
enum class copy_kind : int {
  host_to_host = 0,
  host_to_device = 1,
  device_to_host = 2,
  device_to_device = 3,
  automatic = 4,  ///< cudaMemcpyDefault: inferred from the pointers (unified addressing)
};

/// Where a pointer points; the values are those of `cudaMemoryType`.
enum class memory_type : int {
  unregistered = 0,  ///< ordinary (pageable) host memory, unknown to CUDA
  host = 1,          ///< page-locked host memory (cudaHostAlloc / cudaHostRegister)
  device = 2,        ///< device memory: host code must not touch it
  managed = 3,       ///< unified memory (treated as device memory by cairn)
};

/// The CUDA runtime calls cairn makes, as function pointers taking an opaque `self` (the
/// runtime object; null for the real runtime). Each returns a `status`.
///
/// Contracts follow the CUDA runtime: `host_alloc` is `cudaHostAlloc(p, bytes,
/// cudaHostAllocPortable)`, `stream_create` makes a blocking stream (ordered after work on the
/// legacy default stream), `event_create` makes an event without timing, `memcpy_async`
/// enqueues a copy on a stream, `pointer_get_attributes` reports `memory_type::unregistered`
/// for ordinary host memory.
struct runtime_api {
  void* self = nullptr;  ///< passed as the first argument of every call
  status (*get_device_count)(void* self, int* count) = nullptr;
  status (*pointer_get_attributes)(void* self,
                                   const void* p,
                                   memory_type* type,
                                   int* device) = nullptr;
  status (*host_alloc)(void* self, void** p, std::size_t bytes) = nullptr;
  status (*free_host)(void* self, void* p) = nullptr;
  status (*host_register)(void* self, void* p, std::size_t bytes) = nullptr;
  status (*host_unregister)(void* self, void* p) = nullptr;
  status (*memcpy_async)(void* self,
                         void* dst,
                         const void* src,
                         std::size_t bytes,
                         copy_kind kind,
                         stream_t s) = nullptr;
  status (*stream_create)(void* self, stream_t* s) = nullptr;
  status (*stream_destroy)(void* self, stream_t s) = nullptr;
  status (*stream_synchronize)(void* self, stream_t s) = nullptr;
  status (*stream_wait_event)(void* self, stream_t s, event_t e) = nullptr;
  status (*event_create)(void* self, event_t* e) = nullptr;
  status (*event_record)(void* self, event_t e, stream_t s) = nullptr;
  status (*event_synchronize)(void* self, event_t e) = nullptr;
  status (*event_destroy)(void* self, event_t e) = nullptr;
  const char* (*get_error_string)(void* self, status code) = nullptr;
};

/// "cudaMemcpyAsync: no CUDA-capable device is detected (code 100)": a call name, the runtime's
/// message and the code, for error messages.
inline std::string describe_status(const runtime_api& rt, const char* call, status code) {
  std::string s = call;
  s += ": ";
  const char* msg = rt.get_error_string ? rt.get_error_string(rt.self, code) : nullptr;
  s += msg ? msg : "CUDA error";
  s += " (code " + std::to_string(code) + ")";
  return s;
}

/// What `probe` found: whether device memory and copies can be used.
struct device_status {
  bool usable = false;  ///< at least one device and a working driver
  int count = 0;        ///< devices reported (0 when not usable)
  status code = 0;      ///< the status of cudaGetDeviceCount (0 when it succeeded)
  std::string reason;   ///< why not usable ("" when usable), e.g. the runtime's message
};

/// Asks `rt` for its devices once (cudaGetDeviceCount). Never throws, never prints.
inline device_status probe(const runtime_api& rt) {
  device_status d;
  if (!rt.get_device_count) {
    d.reason = "the runtime table has no get_device_count";
    return d;
  }
  int n = 0;
  d.code = rt.get_device_count(rt.self, &n);
  if (d.code != 0) {
    d.reason = describe_status(rt, "cudaGetDeviceCount", d.code);
    return d;
  }
  if (n <= 0) {
    d.reason = "cudaGetDeviceCount: no device";
    return d;
  }
  d.usable = true;
  d.count = n;
  return d;
}

// Functions whose body depends on CAIRN_HAS_CUDA live in an inline namespace named after the
// configuration, so translation units built with and without cairn::cuda never share (and
// violate the ODR with) one inline function.
#ifdef CAIRN_HAS_CUDA
inline namespace with_cudart {

namespace detail {
inline cudaMemcpyKind to_cuda(copy_kind k) {
  return static_cast<cudaMemcpyKind>(static_cast<int>(k));
}
}  // namespace detail

/// The table over libcudart (only with CAIRN_HAS_CUDA, i.e. when linking cairn::cuda).
inline const runtime_api& real_runtime() {
  static const runtime_api api = [] {
    runtime_api a;
    a.get_device_count = [](void*, int* n) -> status { return cudaGetDeviceCount(n); };
    a.pointer_get_attributes = [](void*, const void* p, memory_type* t, int* dev) -> status {
      cudaPointerAttributes attr{};
      cudaError_t e = cudaPointerGetAttributes(&attr, p);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky last error for later calls
        return e;
      }
      *t = static_cast<memory_type>(static_cast<int>(attr.type));
      *dev = attr.device;
      return 0;
    };
    a.host_alloc = [](void*, void** p, std::size_t bytes) -> status {
      return cudaHostAlloc(p, bytes, cudaHostAllocPortable);
    };
    a.free_host = [](void*, void* p) -> status { return cudaFreeHost(p); };
    a.host_register = [](void*, void* p, std::size_t bytes) -> status {
      return cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    };
    a.host_unregister = [](void*, void* p) -> status { return cudaHostUnregister(p); };
    a.memcpy_async = [](void*, void* dst, const void* src, std::size_t bytes, copy_kind k,
                        stream_t s) -> status {
      return cudaMemcpyAsync(dst, src, bytes, detail::to_cuda(k), static_cast<cudaStream_t>(s));
    };
    a.stream_create = [](void*, stream_t* s) -> status {
      cudaStream_t st = nullptr;
      cudaError_t e = cudaStreamCreate(&st);
      *s = st;
      return e;
    };
    a.stream_destroy = [](void*, stream_t s) -> status {
      return cudaStreamDestroy(static_cast<cudaStream_t>(s));
    };
    a.stream_synchronize = [](void*, stream_t s) -> status {
      return cudaStreamSynchronize(static_cast<cudaStream_t>(s));
    };
    a.stream_wait_event = [](void*, stream_t s, event_t e) -> status {
      return cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0);
    };
    a.event_create = [](void*, event_t* e) -> status {
      cudaEvent_t ev = nullptr;
      cudaError_t r = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      *e = ev;
      return r;
    };
    a.event_record = [](void*, event_t e, stream_t s) -> status {
      return cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s));
    };
    a.event_synchronize = [](void*, event_t e) -> status {
      return cudaEventSynchronize(static_cast<cudaEvent_t>(e));
    };
    a.event_destroy = [](void*, event_t e) -> status {
      return cudaEventDestroy(static_cast<cudaEvent_t>(e));
    };
    a.get_error_string = [](void*, status code) -> const char* {
      return cudaGetErrorString(static_cast<cudaError_t>(code));
    };
    return a;
  }();
  return api;
}

/// The runtime cairn uses unless told otherwise: `&real_runtime()` with CAIRN_HAS_CUDA, else
/// null (host-only: every pointer is host memory).
inline const runtime_api* default_runtime() noexcept { return &real_runtime(); }

}  // namespace with_cudart
#else
inline namespace without_cudart {

/// The runtime cairn uses unless told otherwise: `&real_runtime()` with CAIRN_HAS_CUDA, else
/// null (host-only: every pointer is host memory).
inline const runtime_api* default_runtime() noexcept { return nullptr; }

}  // namespace without_cudart
#endif

/// Whether this process can use a CUDA device through `default_runtime()`, probed once (the
/// first call) and cached: without CAIRN_HAS_CUDA, or when the driver or device is missing
/// (cudaErrorInsufficientDriver, 35), `usable` is false and `reason` says why. Thread-safe;
/// never prints.
#ifdef CAIRN_HAS_CUDA
inline namespace with_cudart {
#else
inline namespace without_cudart {
#endif
inline const device_status& system_device() {
  static const device_status d = [] {
    const runtime_api* rt = default_runtime();
    if (!rt) {
      device_status s;
      s.reason = "cairn was built without CUDA (link cairn::cuda to enable it)";
      return s;
    }
    return probe(*rt);
  }();
  return d;
}

/// The runtime to use for device work: `rt` when given, else `default_runtime()`; null when the
/// chosen runtime has no usable device (`probe` for an injected runtime, the cached
/// `system_device()` for the default one). Null means "host only".
inline const runtime_api* usable_runtime(const runtime_api* rt = nullptr) {
  if (rt) return probe(*rt).usable ? rt : nullptr;
  return system_device().usable ? default_runtime() : nullptr;
}
}  // inline namespace with_cudart / without_cudart

}  // namespace cairn::cuda
