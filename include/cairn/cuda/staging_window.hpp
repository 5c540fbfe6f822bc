// cairn/cuda/staging_window.hpp: a bounded window of host staging memory through which a
// synchronous save reads device tensors piece by piece (and a load could write them), so that
// the pinned memory a save uses is the window, not the device state.
//
// Standard library only (plus the CUDA runtime header with CAIRN_HAS_CUDA): compiles under nvcc
// and in plain host builds.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/cuda/runtime.hpp"
#include "cairn/cuda/staging_pool.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::cuda {

/// A fixed number of slots of host staging memory, `piece_bytes` each, carved out of a
/// `staging_pool` (grown to fit when it is idle and smaller). A thread that moves device bytes
/// takes a slot (waiting while every slot is taken), copies a piece of at most `piece_bytes`
/// into it or out of it on the slot's own stream, uses it, and gives it back by destroying
/// it. Peak host memory is `slots * piece_bytes`, whatever the size of the device state.
///
///     auto w = staging_window::open(pool, rt, 8 << 20, 2).value();
///     auto s = w->take();                       // waits for a free slot
///     s.from_device(0, dev_ptr, n).value();     // enqueue a device-to-host copy
///     s.wait().value();                         // the bytes are in s.bytes()
///
/// Thread-safe: slots are taken and used from many threads at once. Copies on one slot are
/// ordered after the work queued on the legacy default stream (the slot streams are blocking).
class staging_window {
 public:
  /// A window of `slots` slots of `piece_bytes` each over `pool`, which must be idle (nothing
  /// acquired) and outlive the window; the window acquires its slots from it (the owner resets
  /// the pool afterwards). `rt` must be a usable runtime. Errors: a pool that is in use or
  /// cannot grow (errc::invalid_argument, errc::io); zero slots or zero-byte pieces.
  static result<std::unique_ptr<staging_window>> open(staging_pool& pool,
                                                      const runtime_api& rt,
                                                      std::size_t piece_bytes,
                                                      std::size_t slots);
  staging_window(const staging_window&) = delete;
  staging_window& operator=(const staging_window&) = delete;
  /// Waits for every slot's copies and destroys the slot streams. Every slot must have been
  /// given back.
  ~staging_window();

  /// A taken slot: `piece_bytes()` of host memory and a stream of its own. Given back (after
  /// waiting for its copies) when destroyed.
  class slot {
   public:
    slot(slot&& o) noexcept : w_(o.w_), index_(o.index_) { o.w_ = nullptr; }
    slot& operator=(slot&&) = delete;
    ~slot();
    /// The slot's host memory.
    std::span<std::byte> bytes() const noexcept;
    /// Enqueues a copy of `n` bytes from device address `src` to `bytes()` + `at`.
    result<void> from_device(std::size_t at, const void* src, std::size_t n);
    /// Enqueues a copy of `n` bytes from `bytes()` + `at` to device address `dst`.
    result<void> to_device(void* dst, std::size_t at, std::size_t n);
    /// Waits until the copies enqueued on this slot have finished (a device fault is errc::io).
    result<void> wait();

   private:
    friend class staging_window;
    slot(staging_window& w, std::size_t index) : w_(&w), index_(index) {}
    staging_window* w_;
    std::size_t index_;
  };

  /// Takes a free slot, waiting while every slot is taken.
  slot take();
  /// The bytes of one slot.
  std::size_t piece_bytes() const noexcept { return piece_; }
  /// How many slots.
  std::size_t slots() const noexcept { return memory_.size(); }
  /// The most slots taken at once so far.
  std::size_t peak_slots() const;

 private:
  staging_window(const runtime_api& rt, std::size_t piece) : rt_(&rt), piece_(piece) {}
  void give_back(std::size_t index);
  /// Enqueues a copy between bytes [at, at + n) of slot `index` and `device` on the slot's
  /// stream, in direction `k`.
  result<void> copy(
      std::size_t index, std::size_t at, const void* device, std::size_t n, copy_kind k);

  const runtime_api* rt_;
  std::size_t piece_;
  std::vector<std::span<std::byte>> memory_;  // by slot
  std::vector<stream_t> streams_;             // by slot (null until created)
  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::size_t> free_;  // slot indices
  std::size_t taken_ = 0, peak_ = 0;
};

/// Moves bytes between host memory and device memory through one slot of a window at a time,
/// for code that copies many small runs (a load scattering what it read into device tensors).
/// `put` packs host bytes into the slot and enqueues their copy to the device; when the slot is
/// full it is waited for and reused; `get` copies device bytes to host memory piece by piece,
/// waiting for each. `flush` waits for every `put` and gives the slot back (the destructor
/// flushes too, ignoring errors). One thread per mover.
class window_mover {
 public:
  explicit window_mover(staging_window& w) : w_(&w) {}
  window_mover(const window_mover&) = delete;
  window_mover& operator=(const window_mover&) = delete;
  ~window_mover() { (void)flush(); }
  /// Copies `n` host bytes at `src` to device address `dst` (complete after `flush`).
  result<void> put(void* dst, const void* src, std::size_t n);
  /// Copies `n` bytes at device address `src` to host memory at `dst` (complete on return,
  /// after the earlier `put`s).
  result<void> get(void* dst, const void* src, std::size_t n);
  /// Waits for every `put` and gives the slot back.
  result<void> flush();

 private:
  /// The slot, taken when first needed, with nothing pending in it.
  result<staging_window::slot*> drained();
  staging_window* w_;
  std::optional<staging_window::slot> slot_;
  std::size_t used_ = 0;  // bytes of the slot holding puts not yet waited for
};

}  // namespace cairn::cuda

#if CAIRN_HEADER_ONLY
#  include "cairn/cuda/staging_window-inl.hpp"
#endif
