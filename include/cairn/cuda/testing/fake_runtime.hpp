// cairn/cuda/testing/fake_runtime.hpp: a test double of the CUDA runtime calls cairn makes,
// behaving like a device with its own memory, so the device paths of staging run (and are
// tested) on machines without a GPU.
//
// - Device memory (`device_malloc`) is an address range reserved with PROT_NONE: host code that
//   touches it directly crashes, like on a real GPU. Its contents live elsewhere and move only
//   through `memcpy_async` (or the test helpers `device_write` / `device_read`).
// - Copies are deferred: `memcpy_async` validates and queues; the queue of a stream runs only
//   when an event recorded after the copy, or the stream, is synchronized (or `drain()`), so
//   code that reads staged bytes without waiting sees stale data.
// - Every misuse (a copy whose kind does not match its pointers, a range outside an allocation,
//   an unknown stream or event, freeing what was not allocated) returns cudaErrorInvalidValue
//   (1) and is recorded in `misuse()`. Failures can be injected.
//
// POSIX only (mmap); for tests, not for production use.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cairn/cuda/runtime.hpp"

namespace cairn::cuda::testing {

/// A fake CUDA runtime with `device_count` devices (0: cudaGetDeviceCount reports no device).
/// Thread-safe. Pass `api()` wherever cairn takes a `const runtime_api*`.
class fake_runtime {
 public:
  /// What the fake has seen, for assertions.
  struct counters {
    int host_allocs = 0;                ///< successful cudaHostAlloc calls
    int host_frees = 0;                 ///< successful cudaFreeHost calls
    int memcpy_calls = 0;               ///< cudaMemcpyAsync calls accepted
    int d2h = 0;                        ///< device-to-host copies accepted
    int h2d = 0;                        ///< host-to-device copies accepted
    std::size_t bytes = 0;              ///< bytes of accepted copies
    int pointer_queries = 0;            ///< cudaPointerGetAttributes calls
    int streams_created = 0;            ///< cudaStreamCreate calls that succeeded
    int events_created = 0;             ///< cudaEventCreate calls that succeeded
    int synchronizes = 0;               ///< event or stream synchronizations
    int device_count_calls = 0;         ///< cudaGetDeviceCount calls
    std::size_t pinned_bytes = 0;       ///< bytes of pinned host memory allocated now
    std::size_t peak_pinned_bytes = 0;  ///< the most pinned bytes allocated at once
  };

  /// A fake with `device_count` devices.
  explicit fake_runtime(int device_count = 1) : device_count_(device_count) {
    streams_[nullptr];  // the legacy default stream
    api_.self = this;
    api_.get_device_count = [](void* s, int* n) { return self(s).get_device_count(n); };
    api_.pointer_get_attributes = [](void* s, const void* p, memory_type* t, int* d) {
      return self(s).pointer_get_attributes(p, t, d);
    };
    api_.host_alloc = [](void* s, void** p, std::size_t n) { return self(s).host_alloc(p, n); };
    api_.free_host = [](void* s, void* p) { return self(s).free_host(p); };
    api_.host_register = [](void* s, void* p, std::size_t n) {
      return self(s).host_register(p, n);
    };
    api_.host_unregister = [](void* s, void* p) { return self(s).host_unregister(p); };
    api_.memcpy_async = [](void* s, void* d, const void* src, std::size_t n, copy_kind k,
                           stream_t st) { return self(s).memcpy_async(d, src, n, k, st); };
    api_.stream_create = [](void* s, stream_t* st) { return self(s).stream_create(st); };
    api_.stream_destroy = [](void* s, stream_t st) { return self(s).stream_destroy(st); };
    api_.stream_synchronize = [](void* s, stream_t st) { return self(s).stream_synchronize(st); };
    api_.stream_wait_event = [](void* s, stream_t st, event_t e) {
      return self(s).stream_wait_event(st, e);
    };
    api_.event_create = [](void* s, event_t* e) { return self(s).event_create(e); };
    api_.event_record = [](void* s, event_t e, stream_t st) { return self(s).event_record(e, st); };
    api_.event_synchronize = [](void* s, event_t e) { return self(s).event_synchronize(e); };
    api_.event_destroy = [](void* s, event_t e) { return self(s).event_destroy(e); };
    api_.get_error_string = [](void*, status c) { return error_string(c); };
  }
  fake_runtime(const fake_runtime&) = delete;
  fake_runtime& operator=(const fake_runtime&) = delete;
  ~fake_runtime() {
    for (auto& [base, a] : device_) ::munmap(reinterpret_cast<void*>(base), a.reserved);
    for (auto& [base, n] : pinned_)
      ::operator delete (reinterpret_cast<void*>(base), std::align_val_t{4096});
  }

  /// The table to pass to cairn (its `self` is this object).
  const runtime_api& api() const noexcept { return api_; }
  /// Runtime error strings for the codes the fake returns.
  static const char* error_string(status c) noexcept {
    switch (c) {
      case 0:
        return "no error";
      case 1:
        return "invalid argument";
      case 2:
        return "out of memory";
      case 35:
        return "CUDA driver version is insufficient for CUDA runtime version";
      case 100:
        return "no CUDA-capable device is detected";
      case 400:
        return "invalid resource handle";
      case 700:
        return "an illegal memory access was encountered";
      default:
        return "unknown error";
    }
  }

  // --- device memory (test side) ------------------------------------------------------------

  /// `bytes` of fake device memory: an address range the host cannot touch.
  void* device_malloc(std::size_t bytes) {
    std::size_t reserved = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
    void* p =
        ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    std::lock_guard lock(mu_);
    device_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, reserved, std::vector<std::byte>(bytes)};
    return p;
  }
  /// Frees fake device memory.
  void device_free(void* p) {
    std::lock_guard lock(mu_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end()) {
      misuse_.push_back("device_free of an unknown pointer");
      return;
    }
    ::munmap(p, it->second.reserved);
    device_.erase(it);
  }
  /// Writes into device memory directly (a synchronous cudaMemcpy, for test setup).
  void device_write(void* dst, const void* src, std::size_t n) {
    std::lock_guard lock(mu_);
    std::byte* d = backing(dst, n);
    if (!d) throw std::invalid_argument("fake_runtime::device_write outside device memory");
    std::memcpy(d, src, n);
  }
  /// Reads device memory directly (a synchronous cudaMemcpy, for test checks).
  std::vector<std::byte> device_read(const void* src, std::size_t n) const {
    std::lock_guard lock(mu_);
    const std::byte* s = const_cast<fake_runtime*>(this)->backing(src, n);
    if (!s) throw std::invalid_argument("fake_runtime::device_read outside device memory");
    return std::vector<std::byte>(s, s + n);
  }

  // --- fault injection ------------------------------------------------------------------------

  /// cudaGetDeviceCount returns `code` (e.g. 35, no driver); 0 restores normal behaviour.
  void fail_device_count(status code) {
    std::lock_guard lock(mu_);
    count_error_ = code;
  }
  /// Every cudaHostAlloc returns `code` (e.g. 2, out of memory); 0 restores.
  void fail_host_alloc(status code) {
    std::lock_guard lock(mu_);
    host_alloc_error_ = code;
  }
  /// The next `after`+1-th cudaMemcpyAsync returns `code` (after `after` more succeed).
  void fail_memcpy(int after, status code = 1) {
    std::lock_guard lock(mu_);
    memcpy_fail_after_ = after;
    memcpy_error_ = code;
  }
  /// The next synchronization returns `code`, as an asynchronous device fault would (e.g. 700).
  void fail_next_sync(status code = 700) {
    std::lock_guard lock(mu_);
    sync_error_ = code;
  }

  // --- inspection -----------------------------------------------------------------------------

  /// Counters of the calls seen.
  counters stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  /// Every misuse seen, one line each (empty when cairn used the runtime correctly).
  std::vector<std::string> misuse() const {
    std::lock_guard lock(mu_);
    return misuse_;
  }
  /// Streams, events and pinned allocations not yet destroyed / freed.
  int live_streams() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(streams_.size()) - 1;  // not the default stream
  }
  int live_events() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(events_.size());
  }
  int live_pinned() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(pinned_.size());
  }
  /// Copies enqueued and not yet executed, over all streams.
  std::size_t pending_copies() const {
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (auto& [id, q] : streams_)
      for (auto& op : q)
        if (!op.event) ++n;
    return n;
  }
  /// Executes every queued copy now (as if the device ran ahead of the host).
  void drain() {
    std::lock_guard lock(mu_);
    for (auto& [id, q] : streams_) run_until(q, nullptr);
  }

 private:
  struct device_alloc {
    std::size_t bytes;
    std::size_t reserved;
    std::vector<std::byte> data;
  };
  struct op {
    void* dst = nullptr;  // host pointer or device address
    const void* src = nullptr;
    std::size_t bytes = 0;
    copy_kind kind = copy_kind::host_to_host;
    event_t event = nullptr;  // non-null: an event marker
  };
  using queue = std::deque<op>;

  static fake_runtime& self(void* s) { return *static_cast<fake_runtime*>(s); }

  // The backing bytes of [p, p+n) if it lies inside one device allocation, else null.
  std::byte* backing(const void* p, std::size_t n) {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = device_.upper_bound(a);
    if (it == device_.begin()) return nullptr;
    --it;
    std::uintptr_t off = a - it->first;
    if (off >= it->second.reserved) return nullptr;
    if (off > it->second.bytes || n > it->second.bytes - off) return nullptr;
    return it->second.data.data() + off;
  }
  // Whether [p, p+n) overlaps any device reservation.
  bool touches_device(const void* p, std::size_t n) const {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = device_.upper_bound(a + std::max<std::size_t>(n, 1) - 1);
    if (it == device_.begin()) return false;
    --it;
    return a < it->first + it->second.reserved;
  }
  status misuse(std::string what) {
    misuse_.push_back(std::move(what));
    return 1;
  }

  status get_device_count(int* n) {
    std::lock_guard lock(mu_);
    ++stats_.device_count_calls;
    if (count_error_ != 0) {
      *n = 0;
      return count_error_;
    }
    *n = device_count_;
    return device_count_ > 0 ? 0 : 100;
  }
  status pointer_get_attributes(const void* p, memory_type* t, int* d) {
    std::lock_guard lock(mu_);
    ++stats_.pointer_queries;
    *d = -1;
    if (touches_device(p, 1)) {
      *t = memory_type::device;
      *d = 0;
    } else if (in_pinned(p)) {
      *t = memory_type::host;
      *d = 0;
    } else {
      *t = memory_type::unregistered;
    }
    return 0;
  }
  bool in_pinned(const void* p) const {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = pinned_.upper_bound(a);
    if (it == pinned_.begin()) return false;
    --it;
    return a < it->first + std::max<std::size_t>(it->second, 1);
  }
  status host_alloc(void** p, std::size_t n) {
    std::lock_guard lock(mu_);
    if (host_alloc_error_ != 0) {
      *p = nullptr;
      return host_alloc_error_;
    }
    *p = ::operator new (std::max<std::size_t>(n, 1), std::align_val_t{4096});
    pinned_[reinterpret_cast<std::uintptr_t>(*p)] = n;
    ++stats_.host_allocs;
    stats_.pinned_bytes += n;
    stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, stats_.pinned_bytes);
    return 0;
  }
  status free_host(void* p) {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == pinned_.end())
      return misuse("cudaFreeHost of a pointer cudaHostAlloc did not return");
    ::operator delete (p, std::align_val_t{4096});
    stats_.pinned_bytes -= it->second;
    pinned_.erase(it);
    ++stats_.host_frees;
    return 0;
  }
  status host_register(void* p, std::size_t n) {
    std::lock_guard lock(mu_);
    if (touches_device(p, n)) return misuse("cudaHostRegister of device memory");
    registered_.insert(reinterpret_cast<std::uintptr_t>(p));
    return 0;
  }
  status host_unregister(void* p) {
    std::lock_guard lock(mu_);
    if (registered_.erase(reinterpret_cast<std::uintptr_t>(p)) == 0)
      return misuse("cudaHostUnregister of memory not registered");
    return 0;
  }
  status memcpy_async(void* dst, const void* src, std::size_t n, copy_kind k, stream_t s) {
    std::lock_guard lock(mu_);
    auto q = streams_.find(s);
    if (q == streams_.end()) return misuse("cudaMemcpyAsync on an unknown stream");
    bool dst_dev = touches_device(dst, n), src_dev = touches_device(src, n);
    if (k == copy_kind::automatic)
      k = static_cast<copy_kind>((src_dev ? 2 : 0) + (dst_dev ? 1 : 0));
    bool want_src_dev = k == copy_kind::device_to_host || k == copy_kind::device_to_device;
    bool want_dst_dev = k == copy_kind::host_to_device || k == copy_kind::device_to_device;
    if (src_dev != want_src_dev || dst_dev != want_dst_dev)
      return misuse("cudaMemcpyAsync: copy kind " + std::to_string(static_cast<int>(k)) +
                    " does not match the pointers (source on device: " + (src_dev ? "yes" : "no") +
                    ", destination on device: " + (dst_dev ? "yes" : "no") + ")");
    if ((src_dev && !backing(src, n)) || (dst_dev && !backing(dst, n)))
      return misuse("cudaMemcpyAsync: " + std::to_string(n) +
                    " bytes run past the end of a device allocation");
    if (memcpy_fail_after_ >= 0 && memcpy_fail_after_-- == 0) return memcpy_error_;
    q->second.push_back({dst, src, n, k, nullptr});
    ++stats_.memcpy_calls;
    if (k == copy_kind::device_to_host) ++stats_.d2h;
    if (k == copy_kind::host_to_device) ++stats_.h2d;
    stats_.bytes += n;
    return 0;
  }
  status stream_create(stream_t* s) {
    std::lock_guard lock(mu_);
    *s = reinterpret_cast<stream_t>(++next_handle_);
    streams_[*s];
    ++stats_.streams_created;
    return 0;
  }
  status stream_destroy(stream_t s) {
    std::lock_guard lock(mu_);
    auto it = streams_.find(s);
    if (!s || it == streams_.end()) return misuse("cudaStreamDestroy of an unknown stream");
    run_until(it->second, nullptr);  // pending work completes, as on a device
    streams_.erase(it);
    return 0;
  }
  status stream_synchronize(stream_t s) {
    std::lock_guard lock(mu_);
    auto it = streams_.find(s);
    if (it == streams_.end()) return misuse("cudaStreamSynchronize of an unknown stream");
    ++stats_.synchronizes;
    run_until(it->second, nullptr);
    return take_sync_error();
  }
  status stream_wait_event(stream_t s, event_t e) {
    std::lock_guard lock(mu_);
    if (!streams_.count(s)) return misuse("cudaStreamWaitEvent on an unknown stream");
    auto ev = events_.find(e);
    if (ev == events_.end()) return misuse("cudaStreamWaitEvent on an unknown event");
    // Completing the event's work now satisfies the ordering.
    run_event(ev->second, e);
    return 0;
  }
  status event_create(event_t* e) {
    std::lock_guard lock(mu_);
    *e = reinterpret_cast<event_t>(++next_handle_);
    events_[*e] = nullptr;
    ++stats_.events_created;
    return 0;
  }
  status event_record(event_t e, stream_t s) {
    std::lock_guard lock(mu_);
    auto ev = events_.find(e);
    if (ev == events_.end()) return misuse("cudaEventRecord of an unknown event");
    auto q = streams_.find(s);
    if (q == streams_.end()) return misuse("cudaEventRecord on an unknown stream");
    // As cudaEventRecord: the event now stands for this record only, so an earlier marker of
    // it (on any stream) must not end a later synchronization early.
    for (auto& [id, queued] : streams_)
      std::erase_if(queued, [e](const op& o) { return o.event == e; });
    q->second.push_back({nullptr, nullptr, 0, copy_kind::host_to_host, e});
    ev->second = s;
    return 0;
  }
  status event_synchronize(event_t e) {
    std::lock_guard lock(mu_);
    auto ev = events_.find(e);
    if (ev == events_.end()) return misuse("cudaEventSynchronize of an unknown event");
    ++stats_.synchronizes;
    run_event(ev->second, e);
    return take_sync_error();
  }
  status event_destroy(event_t e) {
    std::lock_guard lock(mu_);
    if (events_.erase(e) == 0) return misuse("cudaEventDestroy of an unknown event");
    return 0;
  }
  status take_sync_error() {
    status s = sync_error_;
    sync_error_ = 0;
    return s;
  }
  void run_event(stream_t s, event_t e) {
    auto q = streams_.find(s);
    if (q != streams_.end()) run_until(q->second, e);
  }
  // Runs queued ops up to and including the marker of `until` (all of them when null).
  void run_until(queue& q, event_t until) {
    while (!q.empty()) {
      op o = q.front();
      q.pop_front();
      if (o.event) {
        if (o.event == until) return;
        continue;
      }
      const std::byte* src =
          o.kind == copy_kind::device_to_host || o.kind == copy_kind::device_to_device
              ? backing(o.src, o.bytes)
              : static_cast<const std::byte*>(o.src);
      std::byte* dst = o.kind == copy_kind::host_to_device || o.kind == copy_kind::device_to_device
                           ? backing(o.dst, o.bytes)
                           : static_cast<std::byte*>(o.dst);
      if (!src || !dst) {
        misuse_.push_back("a queued copy's device memory was freed before it ran");
        continue;
      }
      if (o.bytes) std::memmove(dst, src, o.bytes);
    }
  }

  runtime_api api_;
  int device_count_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, device_alloc> device_;
  std::map<std::uintptr_t, std::size_t> pinned_;
  std::set<std::uintptr_t> registered_;
  std::map<stream_t, queue> streams_;
  std::map<event_t, stream_t> events_;  // event -> stream it was last recorded on
  std::uintptr_t next_handle_ = 0x1000;
  status count_error_ = 0;
  status host_alloc_error_ = 0;
  int memcpy_fail_after_ = -1;
  status memcpy_error_ = 1;
  status sync_error_ = 0;
  counters stats_;
  std::vector<std::string> misuse_;
};

}  // namespace cairn::cuda::testing
