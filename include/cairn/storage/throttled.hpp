// cairn/storage/throttled.hpp: throttled_storage<S>, a decorator that paces the bytes written
// through a backend (and, optionally, read) to a rate, so that a rank's checkpoint traffic
// leaves room for the training job's own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

/// Rates of a throttled_storage, in bytes per second; 0 leaves that direction unpaced.
struct throttle_options {
  /// Bytes per second of `put` and writers' `write_at`, all threads together.
  std::uint64_t write_bytes_per_second = 0;
  /// Bytes per second of `read`, all threads together.
  std::uint64_t read_bytes_per_second = 0;
};

namespace detail {

/// Paces byte counts to a rate: each call reserves its bytes' share of time after the previous
/// reservation and sleeps until it starts (the first bytes go at once).
class byte_pacer {
 public:
  explicit byte_pacer(std::uint64_t bytes_per_second) : rate_(bytes_per_second) {}

  /// Sleeps until `n` more bytes may go.
  void pace(std::size_t n);

 private:
  std::uint64_t rate_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point next_{};
};

/// The pacers of one throttled_storage, shared with the writers it hands out.
struct throttle_state {
  byte_pacer writes, reads;
  explicit throttle_state(const throttle_options& o)
      : writes(o.write_bytes_per_second), reads(o.read_bytes_per_second) {}
};

/// Wraps a backend's writer: paces its write_at calls.
class throttled_writer final : public object_writer {
 public:
  throttled_writer(std::unique_ptr<object_writer> inner, std::shared_ptr<throttle_state> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}
  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;
  result<void> finish() override { return inner_->finish(); }

 private:
  std::unique_ptr<object_writer> inner_;
  std::shared_ptr<throttle_state> state_;
};

}  // namespace detail

/// A storage decorator that paces the bytes going through it: every `put` and writer
/// `write_at` first waits for its bytes' share of `write_bytes_per_second` (all threads of this
/// decorator together), every `read` for its share of `read_bytes_per_second`. A call's bytes
/// are reserved when it starts, so a burst leaves at the rate (4 MiB at 4 MiB/s: the first
/// `put` of 1 MiB goes at once, the fourth at 0.75 s). Other calls pass straight through.
///
/// ```
/// cairn::s3_storage s3{"s3://bucket/run"};
/// cairn::throttled_storage paced{s3, {.write_bytes_per_second = 200 << 20}};
/// cairn::save(state, paced, comm);
/// ```
///
/// To cap a whole node, give each rank its share of the node's rate, or combine it with
/// `writer_slot_storage` (one writer at a time per slot). Thread-safe as the wrapped backend is.
/// The referenced backend must outlive it; writers it hands out may outlive the decorator.
template <storage S>
class throttled_storage : public storage_decorator<S> {
  using storage_decorator<S>::inner_;

 public:
  /// Wraps `inner` with the rates of `opt`.
  throttled_storage(S& inner, throttle_options opt)
      : storage_decorator<S>(inner), state_(std::make_shared<detail::throttle_state>(opt)) {}

  result<void> put(std::string_view name, std::span<const std::byte> data) {
    state_->writes.pace(data.size());
    return inner_->put(name, data);
  }
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, inner_->open_writer(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::throttled_writer>(std::move(w), state_));
  }
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    state_->reads.pace(out.size());
    return inner_->read(name, offset, out);
  }

 private:
  std::shared_ptr<detail::throttle_state> state_;
};

static_assert(storage<throttled_storage<memory_storage>>);
static_assert(storage<throttled_storage<file_storage>>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/throttled-inl.hpp"
#endif
