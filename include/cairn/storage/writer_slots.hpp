// cairn/storage/writer_slots.hpp: node-wide writer slots (at most `limit` writers at once among
// every process of a node, through flock(2) on files in a node-local directory), and
// writer_slot_storage<S>, a decorator whose every write holds a slot. async_saver holds a slot
// around each background write with the same class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// One held writer slot (see `writer_slots`): released when it is destroyed. Movable.
class writer_slot {
 public:
  /// Holds nothing.
  writer_slot() = default;
  writer_slot(writer_slot&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  writer_slot& operator=(writer_slot&& o) noexcept;
  writer_slot(const writer_slot&) = delete;
  writer_slot& operator=(const writer_slot&) = delete;
  ~writer_slot() { release(); }

  /// Whether a slot's lock is held (false without a limit, or when the lock files could not be
  /// opened).
  bool held() const noexcept { return fd_ >= 0; }

 private:
  friend class writer_slots;
  explicit writer_slot(int fd) noexcept : fd_(fd) {}
  void release() noexcept;
  int fd_ = -1;
};

/// A node-wide cap on concurrent writers: slot k is an exclusive flock(2) on
/// `<dir>/cairn-writer-<k>.lock`, k < `limit`, so every process (and every thread: each
/// acquisition opens its own file description) that uses the same directory shares the `limit`
/// slots. Give every rank of a node the same node-local directory (not a shared file system,
/// where flock may not be shared between machines or may be slow). A process that dies releases
/// its slots.
///
/// ```
/// cairn::writer_slots slots{1, "/tmp"};  // one writer at a time on this node
/// {
///   cairn::writer_slot s = slots.acquire();  // waits for the slot
///   // ... write ...
/// }                                           // released
/// ```
class writer_slots {
 public:
  /// `limit` slots in `dir`; a limit of 0 or less means no limit (`acquire` returns at once).
  writer_slots(int limit, std::string dir) : limit_(limit), dir_(std::move(dir)) {}

  /// The number of slots (0 or less: unlimited).
  int limit() const noexcept { return limit_; }
  /// The directory of the lock files.
  const std::string& dir() const noexcept { return dir_; }

  /// Waits until a slot is free and holds it until the returned guard is destroyed. Without a
  /// limit, or when a lock file cannot be opened (the writer then goes ahead without a slot
  /// rather than never), the guard holds nothing.
  writer_slot acquire() const;

  /// The lock file of slot `k`.
  std::string lock_path(int k) const {
    return dir_ + "/cairn-writer-" + std::to_string(k) + ".lock";
  }

 private:
  // One slot: wait in flock itself, woken as soon as the holder releases it.
  static writer_slot acquire_blocking(const std::string& path);

  int limit_;
  std::string dir_;
};

namespace detail {

/// Wraps a backend's writer: every write_at and finish holds a slot.
class slotted_writer final : public object_writer {
 public:
  slotted_writer(std::unique_ptr<object_writer> inner, writer_slots slots)
      : inner_(std::move(inner)), slots_(std::move(slots)) {}
  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;
  result<void> finish() override;

 private:
  std::unique_ptr<object_writer> inner_;
  writer_slots slots_;
};

}  // namespace detail

/// A storage decorator that makes every write of a node take turns: each `put`, and each
/// `write_at` and `finish` of its writers, holds one of the node's `writer_slots` while it runs
/// (an S3 upload happens inside these calls: a PUT, an UploadPart when a part completes, the
/// rest of the parts and CompleteMultipartUpload in `finish`). Holding a slot per call, not per
/// open writer, means a thread holding several writers open never waits on itself. Reads,
/// lists and removes are not limited.
///
/// ```
/// cairn::s3_storage s3{"s3://bucket/run"};
/// cairn::writer_slot_storage one_at_a_time{s3, cairn::writer_slots{1, "/tmp"}};
/// cairn::save(state, one_at_a_time, comm);   // the ranks of a node upload one at a time
/// ```
///
/// Thread-safe as the wrapped backend is. The referenced backend must outlive it; writers it
/// hands out may outlive the decorator.
template <storage S>
class writer_slot_storage : public storage_decorator<S> {
  using storage_decorator<S>::inner_;

 public:
  /// Wraps `inner`; its writes take turns in `slots`.
  writer_slot_storage(S& inner, writer_slots slots)
      : storage_decorator<S>(inner), slots_(std::move(slots)) {}

  /// The slots its writes take turns in.
  const writer_slots& slots() const noexcept { return slots_; }

  result<void> put(std::string_view name, std::span<const std::byte> data) {
    writer_slot slot = slots_.acquire();
    return inner_->put(name, data);
  }
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, inner_->open_writer(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::slotted_writer>(std::move(w), slots_));
  }

 private:
  writer_slots slots_;
};

static_assert(storage<writer_slot_storage<memory_storage>>);
static_assert(storage<writer_slot_storage<file_storage>>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/writer_slots-inl.hpp"
#endif
