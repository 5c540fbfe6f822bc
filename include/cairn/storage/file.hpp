// cairn/storage/file.hpp: file_storage, the local-file backend (POSIX pwrite/pread, fsync,
// atomic rename) that models cairn::storage.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/detail/posix.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

namespace detail {

/// A read-only fd kept open by file_storage's cache, with the identity of the file it was opened
/// on so a replaced file (rename over it) is noticed.
struct cached_fd {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  cached_fd(int f, dev_t d, ino_t i) noexcept : fd(f), dev(d), ino(i) {}
  cached_fd(const cached_fd&) = delete;
  cached_fd& operator=(const cached_fd&) = delete;
  ~cached_fd();
};

/// A small thread-safe cache name → shared read fd, evicting the least recently used entry when
/// full. An evicted fd is closed once the last reader using it lets go.
class fd_cache {
 public:
  explicit fd_cache(std::size_t capacity) : capacity_(capacity) {}

  std::shared_ptr<const cached_fd> find(const std::string& name);

  void insert(const std::string& name, std::shared_ptr<const cached_fd> fd);

  /// Forgets `name`; when `only` is given, only if the cached fd is still that one.
  void erase(const std::string& name, const cached_fd* only = nullptr);

  void clear();

 private:
  struct entry {
    std::shared_ptr<const cached_fd> fd;
    std::uint64_t last_use = 0;
  };
  std::mutex mu_;
  std::unordered_map<std::string, entry> map_;
  std::uint64_t tick_ = 0;
  std::size_t capacity_;
};

/// A process-unique suffix for temporary files: "<pid>.<16 hex digits>".
CAIRN_INLINE std::string temp_suffix();

/// Writes of at least this many bytes start their writeback at once (see file_writer).
inline constexpr std::size_t early_writeback_bytes = std::size_t{1} << 20;

/// A streaming writer onto one file, returned by file_storage::open_writer.
class file_writer final : public object_writer {
 public:
  file_writer(int fd, std::string path, std::string dir)
      : fd_(fd), path_(std::move(path)), dir_(std::move(dir)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;

  result<void> finish() override;

 private:
  unique_fd fd_;
  std::string path_;
  std::string dir_;
  std::atomic<bool> finished_{false};
};

}  // namespace detail

/// Objects stored as files under a root directory.
///
/// - Names are relative paths with '/' separators ("shards/__0_0.distcp"); names that are empty,
///   absolute, or have empty, "." or ".." components are rejected with errc::invalid_argument.
/// - The root (and its parents) is created on the first write, not by the constructor.
/// - `put` is atomic and durable: it writes a temporary file beside the target, fsyncs it,
///   renames it over the target and fsyncs the directory. Readers see the old or the new file.
/// - `open_writer` writes the target file in place (visible, partial, until `finish()`);
///   `finish()` makes the data and the directory entry durable.
/// - Every member may be called concurrently from many threads. Read fds are cached (up to
///   `fd_cache_size` files); a cached fd is checked against the file's current identity on each
///   read, so a file replaced by another process is reopened.
/// - Errors carry the full path, the byte offset where it applies, and the OS message with its
///   errno name.
///
/// ```
/// cairn::file_storage disk{"/ckpt/step_001000"};
/// cairn::save(state, disk, comm);
/// ```
///
/// A moved-from file_storage may only be destroyed or assigned to.
class file_storage {
 public:
  /// A local file system: reads and lists see every completed write at once, `put` is atomic
  /// (rename) and durable (fsync), writers write in place (visible before `finish()`), and other
  /// processes see the same files.
  static constexpr storage_features features{.read_after_write = true,
                                             .list_after_write = true,
                                             .atomic_put = true,
                                             .writer_hidden_until_finish = false,
                                             .durable = true,
                                             .shared_between_processes = true};

  /// Storage rooted at `root`; `fd_cache_size` read fds stay open between reads (0 disables).
  explicit file_storage(std::filesystem::path root, std::size_t fd_cache_size = 64)
      : root_(std::move(root)), cache_(std::make_unique<detail::fd_cache>(fd_cache_size)) {}

  /// The root directory every name is relative to.
  const std::filesystem::path& root() const noexcept { return root_; }

  /// Atomically replaces (or creates) `name` with `data`, durably (see the class comment).
  result<void> put(std::string_view name, std::span<const std::byte> data);

  /// Creates (or truncates) `name` and returns a writer for parallel positioned writes into it.
  /// The writer owns its fd and may outlive this storage.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name);

  /// Fills `out` with the bytes of `name` starting at `offset`. A file that ends early is an
  /// errc::corrupt "truncated" error whose `offset` is the byte where data ran out; a missing file
  /// is errc::not_found.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const;

  /// The size in bytes of `name`; errc::not_found when there is no such file.
  result<std::uint64_t> size(std::string_view name) const;

  /// Whether `name` exists as a regular file (directories are not objects).
  result<bool> exists(std::string_view name) const;

  /// The names of all files under the root whose names start with `prefix` (a string prefix:
  /// "a" matches "a.bin" and "a/b.bin"), sorted; `put`'s temporary files are never listed. A root
  /// that does not exist yet lists as empty.
  result<std::vector<std::string>> list(std::string_view prefix) const;

  /// Deletes `name`; errc::not_found when there is no such file.
  result<void> remove(std::string_view name);

  /// Deletes the temporary files of `put`s that never finished (see `is_temp_name`) under the
  /// root whose names start with `prefix`; returns how many. Call it only when no `put` into
  /// these names is in flight (a save does, after its commit): a concurrent `put`'s temporary
  /// would be removed under it, failing that put.
  result<std::size_t> remove_temporaries(std::string_view prefix);

  /// The full path of `name`: `(root() / name).string()`.
  std::string describe(std::string_view name) const { return full_path(name).string(); }

  /// Flushes `name` to disk and drops it from the OS page cache (posix_fadvise DONTNEED), so a
  /// following read measures the device rather than memory. Not part of the storage concept.
  result<void> drop_cache(std::string_view name) const;

  /// `drop_cache` for every file `list(prefix)` names.
  result<void> drop_caches(std::string_view prefix = {}) const;

  /// Whether `filename` (a last path component) has the form of `put`'s temporary files,
  /// ".<name>.tmp.<pid>.<16 hex digits>"; such files are hidden from `list`.
  static bool is_temp_name(std::string_view filename) noexcept;

 private:
  std::filesystem::path full_path(std::string_view name) const {
    return root_ / std::filesystem::path(std::string(name));
  }

  static error not_a_file(const std::string& p);

  static error fs_error(const std::error_code& ec, std::string_view op, const std::string& p);

  // mkdir -p that also fsyncs the parent of every directory it creates, so the new entries are
  // durable once the file inside them is.
  static result<void> make_dirs(const std::string& dir);

  // The cached read fd of `name` when it still refers to the file at `p`, else a fresh one.
  result<std::shared_ptr<const detail::cached_fd>> open_for_read(const std::string& name,
                                                                 const std::string& p) const;

  std::filesystem::path root_;
  std::unique_ptr<detail::fd_cache> cache_;
};

static_assert(storage<file_storage>);
static_assert(storage_with_temporaries<file_storage>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/file-inl.hpp"
#endif
