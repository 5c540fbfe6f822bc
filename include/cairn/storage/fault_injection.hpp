// cairn/storage/fault_injection.hpp: faulty_storage<S>, a decorator that forwards to another
// backend, counts its I/O and fails on command the way real disks and servers fail, for tests of
// error paths.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// What an injected fault does to the storage operation it hits (see `faulty_storage::fail_op`).
enum class fault_mode {
  /// The operation fails and does nothing.
  fail,
  /// Writes (`write_at`): the first half of the bytes land, then it fails, as on a full disk;
  /// reads: the first half of the buffer is filled, then it fails; `open_writer`: the writer is
  /// opened and dropped. Other operations fail untouched (a `put` is atomic).
  fail_partial,
  /// The operation is carried out in full, then reports failure: a lost acknowledgement (a
  /// dropped server reply, a rename whose directory fsync failed).
  lost_ack,
  /// A lying disk: `put` and `write_at` store the first half of the bytes and report success;
  /// `finish` reports success without finishing; `remove` reports success and removes nothing;
  /// `read` fills half the buffer and reports success. Metadata calls are unaffected.
  lie_partial,
  /// `read` succeeds with one byte flipped (bit rot, a bad cable). Other calls are unaffected.
  corrupt_read,
};

/// Every fault mode, for tests that try each.
inline constexpr fault_mode all_fault_modes[] = {fault_mode::fail, fault_mode::fail_partial,
                                                 fault_mode::lost_ack, fault_mode::lie_partial,
                                                 fault_mode::corrupt_read};

/// A short name for a fault mode ("lost_ack").
constexpr const char* fault_mode_name(fault_mode m) noexcept {
  switch (m) {
    case fault_mode::fail:
      return "fail";
    case fault_mode::fail_partial:
      return "fail_partial";
    case fault_mode::lost_ack:
      return "lost_ack";
    case fault_mode::lie_partial:
      return "lie_partial";
    case fault_mode::corrupt_read:
      return "corrupt_read";
  }
  return "?";
}

namespace detail {

/// The counters and armed faults of a faulty_storage, shared with the writers it hands out.
struct fault_state {
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> reads{0};
  std::atomic<std::uint64_t> bytes_written{0};
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> write_attempts{0};
  std::atomic<std::uint64_t> write_limit{std::numeric_limits<std::uint64_t>::max()};
  std::atomic<bool> fail_finish{false};
  std::atomic<bool> has_failing_reads{false};
  std::mutex mu;
  std::set<std::string, std::less<>> failing_reads;
  // fail_op: every operation takes a number; the one numbered `fault_at` gets `mode`.
  std::atomic<std::uint64_t> ops{0};
  std::atomic<std::uint64_t> fault_at{std::numeric_limits<std::uint64_t>::max()};
  std::atomic<fault_mode> mode{fault_mode::fail};
  std::atomic<bool> fired{false};
  std::string fired_at;  // guarded by mu

  // Counts a write attempt; true when it must fail.
  bool write_fails() noexcept {
    return write_attempts.fetch_add(1, std::memory_order_relaxed) >=
           write_limit.load(std::memory_order_relaxed);
  }
  bool read_fails(std::string_view name);
  // Numbers one operation; the fault mode it gets, if it is the armed one.
  std::optional<fault_mode> next_op(std::string_view what, std::string_view file);
};

CAIRN_INLINE error injected(std::string what, std::string file);

/// The first half of `data` (at least one byte short of all of it when it has any).
inline std::span<const std::byte> first_half(std::span<const std::byte> data) {
  return data.first(data.size() / 2);
}

/// Wraps a backend's writer: counts and fails its write_at and finish calls.
class faulty_writer final : public object_writer {
 public:
  faulty_writer(std::unique_ptr<object_writer> inner,
                std::shared_ptr<fault_state> state,
                std::string file)
      : inner_(std::move(inner)), state_(std::move(state)), file_(std::move(file)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;

  result<void> finish() override;

 private:
  std::unique_ptr<object_writer> inner_;
  std::shared_ptr<fault_state> state_;
  std::string file_;
};

}  // namespace detail

/// A storage decorator for tests: forwards every call to the backend `S` it references, counts
/// the I/O that passes through, and fails calls once armed, in the ways real storage fails.
///
/// Two ways to arm it:
/// - `fail_op(k, mode)`: the k-th operation from now (of any kind: put, open_writer, write_at,
///   finish, read, size, exists, list, remove) gets the fault `mode` (see `fault_mode`), and
///   only that one. A test runs an operation once unarmed to count its storage operations
///   (`ops()`), then once for every k and mode.
/// - the older, coarser switches: `fail_after_writes`, `fail_reads_of`, `fail_finish`.
///
/// ```
/// cairn::memory_storage mem;
/// cairn::faulty_storage faulty{mem};
/// faulty.fail_op(7, cairn::fault_mode::lost_ack);  // the 8th call happens, then "fails"
/// auto r = cairn::try_save(state, faulty, comm);
/// ```
///
/// Thread-safe as the wrapped backend is. The referenced backend must outlive it; writers it
/// hands out may outlive the decorator (not the backend).
template <storage S>
class faulty_storage {
 public:
  /// Wraps `inner`, unarmed.
  explicit faulty_storage(S& inner)
      : inner_(&inner), state_(std::make_shared<detail::fault_state>()) {}

  /// The wrapped backend.
  S& inner() const noexcept { return *inner_; }

  /// What the wrapped backend guarantees (when unarmed).
  storage_features features() const { return storage_features_of(*inner_); }

  // ---- arming ----

  /// Gives the fault `mode` to the operation `k` operations from now (0: the next one), and to
  /// no other.
  void fail_op(std::uint64_t k, fault_mode mode) {
    state_->mode.store(mode);
    state_->fired.store(false);
    {
      std::lock_guard lock(state_->mu);
      state_->fired_at.clear();
    }
    state_->fault_at.store(state_->ops.load() + k);
  }
  /// Whether the fault armed by `fail_op` has hit an operation.
  bool fault_fired() const noexcept { return state_->fired.load(); }
  /// The operation the fault hit ("put /ckpt/metadata.json"), empty before it fired.
  std::string fault_site() const {
    std::lock_guard lock(state_->mu);
    return state_->fired_at;
  }
  /// Operations seen so far (every call of the storage concept and of its writers).
  std::uint64_t ops() const noexcept { return state_->ops.load(); }
  /// Lets `n` more write calls (`put` or a writer's `write_at`) through, then fails that call
  /// and every later one.
  void fail_after_writes(std::uint64_t n) {
    state_->write_limit.store(state_->write_attempts.load() + n);
  }
  /// Makes every `read` of exactly `name` fail.
  void fail_reads_of(std::string name) {
    std::lock_guard lock(state_->mu);
    state_->failing_reads.insert(std::move(name));
    state_->has_failing_reads.store(true);
  }
  /// Makes writers' `finish()` fail (without finishing the wrapped writer) while `on`.
  void fail_finish(bool on = true) { state_->fail_finish.store(on); }
  /// Clears every armed fault; counters are kept.
  void disarm() {
    state_->write_limit.store(std::numeric_limits<std::uint64_t>::max());
    state_->fail_finish.store(false);
    state_->fault_at.store(std::numeric_limits<std::uint64_t>::max());
    std::lock_guard lock(state_->mu);
    state_->failing_reads.clear();
    state_->has_failing_reads.store(false);
  }

  // ---- counters (calls that reached the backend) ----

  /// Write calls (`put` and `write_at`) forwarded to the backend.
  std::uint64_t writes() const noexcept { return state_->writes.load(); }
  /// `read` calls forwarded to the backend.
  std::uint64_t reads() const noexcept { return state_->reads.load(); }
  /// Bytes successfully written through `put` and `write_at`.
  std::uint64_t bytes_written() const noexcept { return state_->bytes_written.load(); }
  /// Bytes successfully read.
  std::uint64_t bytes_read() const noexcept { return state_->bytes_read.load(); }
  /// Sets all four counters to zero.
  void reset_counters() noexcept {
    state_->writes.store(0);
    state_->reads.store(0);
    state_->bytes_written.store(0);
    state_->bytes_read.store(0);
  }

  // ---- the storage concept, forwarded ----

  result<void> put(std::string_view name, std::span<const std::byte> data) {
    auto fault = state_->next_op("put", describe(name));
    if (state_->write_fails() || fault == fault_mode::fail || fault == fault_mode::fail_partial)
      return detail::injected("put", describe(name));
    if (fault == fault_mode::lie_partial) return inner_->put(name, detail::first_half(data));
    state_->writes.fetch_add(1, std::memory_order_relaxed);
    CAIRN_TRY(inner_->put(name, data));
    state_->bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
    if (fault == fault_mode::lost_ack)
      return detail::injected("put (acknowledgement lost)", describe(name));
    return ok();
  }

  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    auto fault = state_->next_op("open_writer", describe(name));
    if (fault == fault_mode::fail) return detail::injected("open_writer", describe(name));
    CAIRN_TRY_ASSIGN(auto w, inner_->open_writer(name));
    if (fault == fault_mode::fail_partial || fault == fault_mode::lost_ack)
      return detail::injected("open_writer (acknowledgement lost)", describe(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::faulty_writer>(std::move(w), state_, describe(name)));
  }

  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    auto fault = state_->next_op("read", describe(name));
    if (state_->read_fails(name) || fault == fault_mode::fail) {
      error e = detail::injected("read", describe(name));
      e.offset = offset;
      return e;
    }
    if (fault == fault_mode::fail_partial || fault == fault_mode::lie_partial) {
      auto half = out.first(out.size() / 2);
      if (!half.empty()) CAIRN_TRY(inner_->read(name, offset, half));
      if (fault == fault_mode::lie_partial) return ok();  // the rest is whatever was there
      error e = detail::injected("read (short read)", describe(name));
      e.offset = offset + half.size();
      return e;
    }
    state_->reads.fetch_add(1, std::memory_order_relaxed);
    CAIRN_TRY(inner_->read(name, offset, out));
    state_->bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
    if (fault == fault_mode::lost_ack) return detail::injected("read (reply lost)", describe(name));
    if (fault == fault_mode::corrupt_read && !out.empty()) out[out.size() / 2] ^= std::byte{0x10};
    return ok();
  }

  result<std::uint64_t> size(std::string_view name) {
    if (failing_metadata_call("size", name)) return detail::injected("size", describe(name));
    return inner_->size(name);
  }
  result<bool> exists(std::string_view name) {
    if (failing_metadata_call("exists", name)) return detail::injected("exists", describe(name));
    return inner_->exists(name);
  }
  result<std::vector<std::string>> list(std::string_view prefix) {
    if (failing_metadata_call("list", prefix)) return detail::injected("list", describe(prefix));
    return inner_->list(prefix);
  }
  result<void> remove(std::string_view name) {
    auto fault = state_->next_op("remove", describe(name));
    if (fault == fault_mode::fail || fault == fault_mode::fail_partial)
      return detail::injected("remove", describe(name));
    if (fault == fault_mode::lie_partial) return ok();
    CAIRN_TRY(inner_->remove(name));
    if (fault == fault_mode::lost_ack)
      return detail::injected("remove (acknowledgement lost)", describe(name));
    return ok();
  }
  std::string describe(std::string_view name) const { return inner_->describe(name); }
  /// Forwarded when the backend has it (see `storage_with_temporaries`); not a counted operation.
  result<std::size_t> remove_temporaries(std::string_view prefix) {
    return storage_ref(*inner_).remove_temporaries(prefix);
  }

 private:
  // size / exists / list: every failing mode fails them (they change nothing, so "partial" and
  // "lost acknowledgement" look alike); the lying and corrupting modes leave them alone.
  bool failing_metadata_call(const char* what, std::string_view name) {
    auto fault = state_->next_op(what, describe(name));
    return fault == fault_mode::fail || fault == fault_mode::fail_partial ||
           fault == fault_mode::lost_ack;
  }

  S* inner_;
  std::shared_ptr<detail::fault_state> state_;
};

static_assert(storage<faulty_storage<memory_storage>>);
static_assert(storage<faulty_storage<file_storage>>);
static_assert(storage_with_temporaries<faulty_storage<file_storage>>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/fault_injection-inl.hpp"
#endif
