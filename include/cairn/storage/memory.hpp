// cairn/storage/memory.hpp: memory_storage, an in-process backend (a map name → bytes) for
// tests, simulations and staging; it models cairn::storage with the file backend's semantics.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/names.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

namespace detail {

/// The shared state of a memory_storage; writers keep it alive so they may outlive the storage.
struct memory_objects {
  using bytes = std::vector<std::byte>;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const bytes>, std::less<>> objects;

  std::shared_ptr<const bytes> find(std::string_view name) {
    std::lock_guard lock(mu);
    auto it = objects.find(name);
    return it == objects.end() ? nullptr : it->second;
  }
  void publish(std::string_view name, std::shared_ptr<const bytes> b) {
    std::lock_guard lock(mu);
    auto it = objects.find(name);
    if (it == objects.end()) {
      objects.emplace(std::string(name), std::move(b));
    } else {
      it->second = std::move(b);
    }
  }
};

/// The writer of memory_storage: buffers privately and publishes the object on finish().
class memory_writer final : public object_writer {
 public:
  memory_writer(std::shared_ptr<memory_objects> store, std::string name)
      : store_(std::move(store)), name_(std::move(name)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    if (offset > SIZE_MAX - data.size()) {
      error e = make_error(errc::invalid_argument, "write range overflows memory");
      e.file = "mem://" + name_;
      e.offset = offset;
      return e;
    }
    const std::size_t end = static_cast<std::size_t>(offset) + data.size();
    {
      // Writers of ranges inside the buffer copy in parallel under the shared lock; a write that
      // grows the buffer takes it exclusively (growing may move the bytes).
      std::shared_lock lock(mu_);
      if (finished_) return after_finish();
      if (end <= buf_.size()) {
        if (!data.empty()) std::memcpy(buf_.data() + offset, data.data(), data.size());
        return ok();
      }
    }
    std::unique_lock lock(mu_);
    if (finished_) return after_finish();
    if (end > buf_.size()) buf_.resize(end);
    if (!data.empty()) std::memcpy(buf_.data() + offset, data.data(), data.size());
    return ok();
  }

  result<void> finish() override {
    std::unique_lock lock(mu_);
    if (finished_) {
      error e = make_error(errc::invalid_argument, "finish() called twice on mem://" + name_);
      e.file = "mem://" + name_;
      return e;
    }
    finished_ = true;
    store_->publish(name_, std::make_shared<const std::vector<std::byte>>(std::move(buf_)));
    return ok();
  }

 private:
  error after_finish() const {
    error e = make_error(errc::invalid_argument, "write_at after finish() on mem://" + name_);
    e.file = "mem://" + name_;
    return e;
  }

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
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    CAIRN_TRY(check_object_name(name));
    store_->publish(name, std::make_shared<const bytes>(data.begin(), data.end()));
    return ok();
  }

  /// A writer whose bytes become the object `name` when `finish()` succeeds; writes at any offset
  /// grow the object (gaps read as zero).
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::memory_writer>(store_, std::string(name)));
  }

  /// Fills `out` with the bytes of `name` from `offset`; errc::corrupt "truncated" when the
  /// object is shorter, errc::not_found when it is missing.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    CAIRN_TRY(check_object_name(name));
    auto b = store_->find(name);
    if (!b) return missing(name);
    const std::uint64_t size = b->size();
    const std::uint64_t avail = offset < size ? size - offset : 0;
    if (out.size() > avail || offset > size) {
      error e = make_error(errc::corrupt, "truncated: reading " + std::to_string(out.size()) +
                                              " bytes at offset " + std::to_string(offset) +
                                              " of " + describe(name) +
                                              ", the object ends at byte " + std::to_string(size));
      e.file = describe(name);
      e.offset = offset + std::min<std::uint64_t>(avail, out.size());
      return e;
    }
    if (!out.empty()) std::memcpy(out.data(), b->data() + offset, out.size());
    return ok();
  }

  /// The size of `name` in bytes; errc::not_found when missing.
  result<std::uint64_t> size(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    auto b = store_->find(name);
    if (!b) return missing(name);
    return static_cast<std::uint64_t>(b->size());
  }

  /// Whether `name` exists.
  result<bool> exists(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    return store_->find(name) != nullptr;
  }

  /// The sorted names that start with `prefix`.
  result<std::vector<std::string>> list(std::string_view prefix) const {
    CAIRN_TRY(check_list_prefix(prefix));
    std::vector<std::string> names;
    std::lock_guard lock(store_->mu);
    for (auto it = store_->objects.lower_bound(prefix);
         it != store_->objects.end() && it->first.starts_with(prefix); ++it) {
      names.push_back(it->first);
    }
    return names;
  }

  /// Deletes `name`; errc::not_found when missing.
  result<void> remove(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
    std::lock_guard lock(store_->mu);
    auto it = store_->objects.find(name);
    if (it == store_->objects.end()) return missing(name);
    store_->objects.erase(it);
    return ok();
  }

  /// "mem://<name>".
  std::string describe(std::string_view name) const { return "mem://" + std::string(name); }

  // ---- test hooks (not part of the storage concept) ----

  /// Flips every bit of the byte at `offset` of `name` (readers holding the old bytes keep them).
  /// False when the object is missing or too short.
  bool corrupt_byte(std::string_view name, std::uint64_t offset) {
    std::lock_guard lock(store_->mu);
    auto it = store_->objects.find(name);
    if (it == store_->objects.end() || offset >= it->second->size()) return false;
    auto copy = std::make_shared<bytes>(*it->second);
    (*copy)[static_cast<std::size_t>(offset)] ^= std::byte{0xFF};
    it->second = std::move(copy);
    return true;
  }

  /// Cuts `name` down to `new_size` bytes, as a crash during a write would. False when the
  /// object is missing or already no longer than `new_size`.
  bool truncate(std::string_view name, std::uint64_t new_size) {
    std::lock_guard lock(store_->mu);
    auto it = store_->objects.find(name);
    if (it == store_->objects.end() || new_size >= it->second->size()) return false;
    auto n = static_cast<std::ptrdiff_t>(new_size);
    it->second = std::make_shared<const bytes>(it->second->begin(), it->second->begin() + n);
    return true;
  }

  /// A copy of the bytes of `name`, or nullopt when it is missing.
  std::optional<std::vector<std::byte>> contents(std::string_view name) const {
    auto b = store_->find(name);
    if (!b) return std::nullopt;
    return *b;
  }

  /// How many objects are stored.
  std::size_t object_count() const {
    std::lock_guard lock(store_->mu);
    return store_->objects.size();
  }

  /// The total size in bytes of all stored objects.
  std::uint64_t total_bytes() const {
    std::lock_guard lock(store_->mu);
    std::uint64_t n = 0;
    for (const auto& [name, b] : store_->objects) n += b->size();
    return n;
  }

 private:
  using bytes = std::vector<std::byte>;

  error missing(std::string_view name) const {
    error e = make_error(errc::not_found, "no object " + describe(name));
    e.file = describe(name);
    return e;
  }

  std::shared_ptr<detail::memory_objects> store_;
};

static_assert(storage<memory_storage>);

}  // namespace cairn
