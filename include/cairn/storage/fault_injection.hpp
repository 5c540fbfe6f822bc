// cairn/storage/fault_injection.hpp: faulty_storage<S>, a decorator that forwards to another
// backend, counts its I/O and fails on command, for tests of error paths.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

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

  // Counts a write attempt; true when it must fail.
  bool write_fails() noexcept {
    return write_attempts.fetch_add(1, std::memory_order_relaxed) >=
           write_limit.load(std::memory_order_relaxed);
  }
  bool read_fails(std::string_view name) {
    if (!has_failing_reads.load(std::memory_order_relaxed)) return false;
    std::lock_guard lock(mu);
    return failing_reads.find(name) != failing_reads.end();
  }
};

inline error injected(std::string what, std::string file) {
  error e = make_error(errc::io, "injected failure: " + what + " " + file);
  e.file = std::move(file);
  return e;
}

/// Wraps a backend's writer: counts and fails its write_at and finish calls.
class faulty_writer final : public object_writer {
 public:
  faulty_writer(std::unique_ptr<object_writer> inner,
                std::shared_ptr<fault_state> state,
                std::string file)
      : inner_(std::move(inner)), state_(std::move(state)), file_(std::move(file)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    if (state_->write_fails()) {
      error e = injected("write_at", file_);
      e.offset = offset;
      return e;
    }
    state_->writes.fetch_add(1, std::memory_order_relaxed);
    CAIRN_TRY(inner_->write_at(offset, data));
    state_->bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
    return ok();
  }

  result<void> finish() override {
    if (state_->fail_finish.load(std::memory_order_relaxed)) return injected("finish", file_);
    return inner_->finish();
  }

 private:
  std::unique_ptr<object_writer> inner_;
  std::shared_ptr<fault_state> state_;
  std::string file_;
};

}  // namespace detail

/// A storage decorator for tests: forwards every call to the backend `S` it references, counts
/// the I/O that passes through, and fails calls with errc::io "injected failure" once armed.
///
/// ```
/// cairn::memory_storage mem;
/// cairn::faulty_storage faulty{mem};
/// faulty.fail_after_writes(3);          // the 4th write (put or write_at) and all later fail
/// CHECK(!cairn::save(state, faulty, comm));
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

  // ---- arming ----

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
    if (state_->write_fails()) return detail::injected("put", describe(name));
    state_->writes.fetch_add(1, std::memory_order_relaxed);
    CAIRN_TRY(inner_->put(name, data));
    state_->bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
    return ok();
  }

  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, inner_->open_writer(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::faulty_writer>(std::move(w), state_, describe(name)));
  }

  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    if (state_->read_fails(name)) {
      error e = detail::injected("read", describe(name));
      e.offset = offset;
      return e;
    }
    state_->reads.fetch_add(1, std::memory_order_relaxed);
    CAIRN_TRY(inner_->read(name, offset, out));
    state_->bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
    return ok();
  }

  result<std::uint64_t> size(std::string_view name) { return inner_->size(name); }
  result<bool> exists(std::string_view name) { return inner_->exists(name); }
  result<std::vector<std::string>> list(std::string_view prefix) { return inner_->list(prefix); }
  result<void> remove(std::string_view name) { return inner_->remove(name); }
  std::string describe(std::string_view name) const { return inner_->describe(name); }

 private:
  S* inner_;
  std::shared_ptr<detail::fault_state> state_;
};

static_assert(storage<faulty_storage<memory_storage>>);
static_assert(storage<faulty_storage<file_storage>>);

}  // namespace cairn
