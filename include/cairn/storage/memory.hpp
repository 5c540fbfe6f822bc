// cairn/storage/memory.hpp: memory_storage, an in-process backend (a map name → bytes) for
// tests, simulations and staging; it models cairn::storage with the file backend's semantics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

namespace detail {

/// The shared state of a memory_storage; writers keep it alive so they may outlive the storage.
struct memory_objects {
  using bytes = std::vector<std::byte>;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const bytes>, std::less<>> objects;

  std::shared_ptr<const bytes> find(std::string_view name);
  void publish(std::string_view name, std::shared_ptr<const bytes> b);
};

/// The writer of memory_storage: buffers privately and publishes the object on finish().
class memory_writer final : public object_writer {
 public:
  memory_writer(std::shared_ptr<memory_objects> store, std::string name)
      : store_(std::move(store)), name_(std::move(name)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;

  result<void> finish() override;

 private:
  error after_finish() const;

  std::shared_ptr<memory_objects> store_;
  std::string name_;
  std::shared_mutex mu_;
  std::vector<std::byte> buf_;
  bool finished_ = false;
};

}  // namespace detail

/// Objects held in process memory: a thread-safe map name → immutable bytes.
///
/// It behaves like file_storage where the concept speaks: names are validated the same way
/// (errc::invalid_argument), `put` replaces an object atomically (readers keep the bytes they
/// started with), reads past the end are errc::corrupt "truncated" errors naming `mem://<name>`
/// and the byte where data ran out, missing objects are errc::not_found. A writer buffers
/// privately and publishes the whole object on `finish()`; until then the name shows the old
/// object or nothing. Writers may outlive the storage. Every member is thread-safe.
///
/// ```
/// cairn::memory_storage mem;
/// cairn::save(state, mem, comm);
/// mem.corrupt_byte("__0_0.distcp", 100);   // then check that load reports the checksum
/// ```
///
/// A moved-from memory_storage may only be destroyed or assigned to.
class memory_storage {
 public:
  /// One process's memory: consistent and atomic, writers publish on `finish()`, nothing
  /// durable or shared with other processes.
  static constexpr storage_features features{.read_after_write = true,
                                             .list_after_write = true,
                                             .atomic_put = true,
                                             .writer_hidden_until_finish = true,
                                             .durable = false,
                                             .shared_between_processes = false};

  memory_storage() : store_(std::make_shared<detail::memory_objects>()) {}
  memory_storage(const memory_storage&) = delete;
  memory_storage& operator=(const memory_storage&) = delete;
  memory_storage(memory_storage&&) noexcept = default;
  memory_storage& operator=(memory_storage&&) noexcept = default;

  /// Atomically replaces (or creates) `name` with a copy of `data`.
  result<void> put(std::string_view name, std::span<const std::byte> data);

  /// A writer whose bytes become the object `name` when `finish()` succeeds; writes at any offset
  /// grow the object (gaps read as zero).
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name);

  /// Fills `out` with the bytes of `name` from `offset`; errc::corrupt "truncated" when the
  /// object is shorter, errc::not_found when it is missing.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const;

  /// The size of `name` in bytes; errc::not_found when missing.
  result<std::uint64_t> size(std::string_view name) const;

  /// Whether `name` exists.
  result<bool> exists(std::string_view name) const;

  /// The sorted names that start with `prefix`.
  result<std::vector<std::string>> list(std::string_view prefix) const;

  /// Deletes `name`; errc::not_found when missing.
  result<void> remove(std::string_view name);

  /// "mem://<name>".
  std::string describe(std::string_view name) const { return "mem://" + std::string(name); }

  // ---- test hooks (not part of the storage concept) ----

  /// Flips every bit of the byte at `offset` of `name` (readers holding the old bytes keep them).
  /// False when the object is missing or too short.
  bool corrupt_byte(std::string_view name, std::uint64_t offset);

  /// Cuts `name` down to `new_size` bytes, as a crash during a write would. False when the
  /// object is missing or already no longer than `new_size`.
  bool truncate(std::string_view name, std::uint64_t new_size);

  /// A copy of the bytes of `name`, or nullopt when it is missing.
  std::optional<std::vector<std::byte>> contents(std::string_view name) const;

  /// How many objects are stored.
  std::size_t object_count() const;

  /// The total size in bytes of all stored objects.
  std::uint64_t total_bytes() const;

 private:
  using bytes = std::vector<std::byte>;

  error missing(std::string_view name) const;

  std::shared_ptr<detail::memory_objects> store_;
};

static_assert(storage<memory_storage>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/memory-inl.hpp"
#endif
