// cairn/storage/file.hpp: file_storage, the local-file backend (POSIX pwrite/pread, fsync,
// atomic rename) that models cairn::storage.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/detail/posix.hpp"
#include "cairn/storage/names.hpp"
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
  ~cached_fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// A small thread-safe cache name → shared read fd, evicting the least recently used entry when
/// full. An evicted fd is closed once the last reader using it lets go.
class fd_cache {
 public:
  explicit fd_cache(std::size_t capacity) : capacity_(capacity) {}

  std::shared_ptr<const cached_fd> find(const std::string& name) {
    std::lock_guard lock(mu_);
    auto it = map_.find(name);
    if (it == map_.end()) return nullptr;
    it->second.last_use = ++tick_;
    return it->second.fd;
  }

  void insert(const std::string& name, std::shared_ptr<const cached_fd> fd) {
    if (capacity_ == 0) return;
    std::lock_guard lock(mu_);
    auto it = map_.find(name);
    if (it != map_.end()) {
      it->second = {std::move(fd), ++tick_};
      return;
    }
    if (map_.size() >= capacity_) {
      auto oldest = map_.begin();
      for (auto i = map_.begin(); i != map_.end(); ++i) {
        if (i->second.last_use < oldest->second.last_use) oldest = i;
      }
      map_.erase(oldest);
    }
    map_.emplace(name, entry{std::move(fd), ++tick_});
  }

  /// Forgets `name`; when `only` is given, only if the cached fd is still that one.
  void erase(const std::string& name, const cached_fd* only = nullptr) {
    std::lock_guard lock(mu_);
    auto it = map_.find(name);
    if (it != map_.end() && (only == nullptr || it->second.fd.get() == only)) map_.erase(it);
  }

  void clear() {
    std::lock_guard lock(mu_);
    map_.clear();
  }

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
inline std::string temp_suffix() {
  static const std::uint64_t seed = [] {
    std::random_device rd;
    std::uint64_t s = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return s ^
           static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t x = seed + counter.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64 finalizer
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = std::to_string(static_cast<long long>(::getpid())) + '.';
  for (int i = 60; i >= 0; i -= 4) s += hex[(x >> i) & 0xF];
  return s;
}

/// Writes of at least this many bytes start their writeback at once (see file_writer).
inline constexpr std::size_t early_writeback_bytes = std::size_t{1} << 20;

/// A streaming writer onto one file, returned by file_storage::open_writer.
class file_writer final : public object_writer {
 public:
  file_writer(int fd, std::string path, std::string dir)
      : fd_(fd), path_(std::move(path)), dir_(std::move(dir)) {}

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    if (finished_.load(std::memory_order_acquire)) {
      error e = make_error(errc::invalid_argument, "write_at after finish() on " + path_);
      e.file = path_;
      return e;
    }
    if (data.size() > max_file_offset || offset > max_file_offset - data.size()) {
      error e = make_error(errc::invalid_argument, "write range overflows a file offset");
      e.file = path_;
      e.offset = offset;
      return e;
    }
    std::size_t done = 0;
    int err = pwrite_all(fd_.get(), data.data(), data.size(), offset, done);
    if (err != 0) {
      error e = os_error(errc::io, err, "pwrite", path_);
      e.offset = offset + done;
      return e;
    }
#ifdef SYNC_FILE_RANGE_WRITE
    // Start writing these pages to the device now, without waiting: the disk works while the
    // caller copies and checksums the next piece, and finish()'s fdatasync only waits for the
    // tail. Durability still comes from finish(); an error here resurfaces there.
    if (data.size() >= early_writeback_bytes)
      (void)::sync_file_range(fd_.get(), static_cast<off_t>(offset),
                              static_cast<off_t>(data.size()), SYNC_FILE_RANGE_WRITE);
#endif
    return ok();
  }

  result<void> finish() override {
    if (finished_.exchange(true, std::memory_order_acq_rel)) {
      error e = make_error(errc::invalid_argument, "finish() called twice on " + path_);
      e.file = path_;
      return e;
    }
    int fd = fd_.release();
    int err = fsync_retry(fd, /*data_only=*/true);
    int cerr = close_fd(fd);
    if (err != 0) return os_error(errc::io, err, "fdatasync", path_);
    if (cerr != 0) return os_error(errc::io, cerr, "close", path_);
    return fsync_dir(dir_);
  }

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
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    CAIRN_TRY(check_object_name(name));
    std::filesystem::path path = full_path(name);
    std::string dir = path.parent_path().string();
    CAIRN_TRY(make_dirs(dir));
    std::string target = path.string();
    std::string tmp =
        (path.parent_path() / ("." + path.filename().string() + ".tmp." + detail::temp_suffix()))
            .string();
    int fd = detail::open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      error e = detail::os_error(errc::io, errno, "create", tmp);
      e.file = target;
      return e;
    }
    auto fail = [&](error e) -> result<void> {
      ::unlink(tmp.c_str());
      e.file = target;
      return e;
    };
    std::size_t done = 0;
    int err = detail::pwrite_all(fd, data.data(), data.size(), 0, done);
    if (err != 0) {
      detail::close_fd(fd);
      error e = detail::os_error(errc::io, err, "pwrite", tmp);
      e.offset = done;
      return fail(std::move(e));
    }
    err = detail::fsync_retry(fd, /*data_only=*/false);
    int cerr = detail::close_fd(fd);
    if (err != 0) return fail(detail::os_error(errc::io, err, "fsync", tmp));
    if (cerr != 0) return fail(detail::os_error(errc::io, cerr, "close", tmp));
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      return fail(detail::os_error(errc::io, errno, "rename " + tmp + " to", target));
    }
    cache_->erase(std::string(name));
    return detail::fsync_dir(dir);
  }

  /// Creates (or truncates) `name` and returns a writer for parallel positioned writes into it.
  /// The writer owns its fd and may outlive this storage.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
    std::filesystem::path path = full_path(name);
    std::string dir = path.parent_path().string();
    CAIRN_TRY(make_dirs(dir));
    std::string p = path.string();
    int fd = detail::open_retry(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return detail::os_error(errc::io, errno, "open for writing", p);
    cache_->erase(std::string(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::file_writer>(fd, std::move(p), std::move(dir)));
  }

  /// Fills `out` with the bytes of `name` starting at `offset`. A file that ends early is an
  /// errc::corrupt "truncated" error whose `offset` is the byte where data ran out; a missing file
  /// is errc::not_found.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    CAIRN_TRY(check_object_name(name));
    std::string p = describe(name);
    if (out.size() > detail::max_file_offset || offset > detail::max_file_offset - out.size()) {
      error e = make_error(errc::invalid_argument, "read range overflows a file offset");
      e.file = p;
      e.offset = offset;
      return e;
    }
    CAIRN_TRY_ASSIGN(auto f, open_for_read(std::string(name), p));
    std::size_t done = 0;
    int err = detail::pread_all(f->fd, out.data(), out.size(), offset, done);
    if (err != 0) {
      error e = detail::os_error(errc::io, err, "pread", p);
      e.offset = offset + done;
      return e;
    }
    bool short_read = done < out.size();
    if (out.empty()) {
      struct stat st {};
      if (::fstat(f->fd, &st) != 0) return detail::os_error(errc::io, errno, "fstat", p);
      short_read = offset > static_cast<std::uint64_t>(st.st_size);
    }
    if (short_read) {
      error e =
          make_error(errc::corrupt, "truncated: reading " + std::to_string(out.size()) +
                                        " bytes at offset " + std::to_string(offset) + " of " + p +
                                        ", the file ends at byte " + std::to_string(offset + done));
      e.file = p;
      e.offset = offset + done;
      return e;
    }
    return ok();
  }

  /// The size in bytes of `name`; errc::not_found when there is no such file.
  result<std::uint64_t> size(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    std::string p = describe(name);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      return detail::os_error(detail::lookup_errc(errno), errno, "stat", p);
    if (!S_ISREG(st.st_mode)) return not_a_file(p);
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// Whether `name` exists as a regular file (directories are not objects).
  result<bool> exists(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    std::string p = describe(name);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return false;
      return detail::os_error(errc::io, errno, "stat", p);
    }
    return S_ISREG(st.st_mode);
  }

  /// The names of all files under the root whose names start with `prefix` (a string prefix:
  /// "a" matches "a.bin" and "a/b.bin"), sorted; `put`'s temporary files are never listed. A root
  /// that does not exist yet lists as empty.
  result<std::vector<std::string>> list(std::string_view prefix) const {
    namespace fs = std::filesystem;
    CAIRN_TRY(check_list_prefix(prefix));
    std::size_t slash = prefix.rfind('/');
    std::string dirpart(slash == std::string_view::npos ? std::string_view()
                                                        : prefix.substr(0, slash));
    fs::path start = dirpart.empty() ? root_ : root_ / dirpart;
    std::vector<std::string> names;
    std::error_code ec;
    fs::file_status st = fs::status(start, ec);
    if (ec || !fs::is_directory(st)) {
      if (!ec || ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
        return names;
      }
      return fs_error(ec, "stat", start.string());
    }
    const std::string& base = start.native();
    fs::recursive_directory_iterator it(start, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (!it->is_regular_file(ec2)) continue;
      const std::string& full = it->path().native();
      if (is_temp_name(it->path().filename().native())) continue;
      std::string_view rest = std::string_view(full).substr(base.size());
      while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
      std::string rel = dirpart.empty() ? std::string(rest) : dirpart + "/" + std::string(rest);
      if (rel.starts_with(prefix)) names.push_back(std::move(rel));
    }
    if (ec) return fs_error(ec, "list", start.string());
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Deletes `name`; errc::not_found when there is no such file.
  result<void> remove(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
    std::string p = describe(name);
    cache_->erase(std::string(name));
    if (::unlink(p.c_str()) != 0) {
      return detail::os_error(detail::lookup_errc(errno), errno, "unlink", p);
    }
    return ok();
  }

  /// Deletes the temporary files of `put`s that never finished (see `is_temp_name`) under the
  /// root whose names start with `prefix`; returns how many. Call it only when no `put` into
  /// these names is in flight (a save does, after its commit): a concurrent `put`'s temporary
  /// would be removed under it, failing that put.
  result<std::size_t> remove_temporaries(std::string_view prefix) {
    namespace fs = std::filesystem;
    CAIRN_TRY(check_list_prefix(prefix));
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return std::size_t{0};
    std::size_t removed = 0;
    fs::recursive_directory_iterator it(root_, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (!it->is_regular_file(ec2) || !is_temp_name(it->path().filename().native())) continue;
      // The name the temporary stands for: ".<name>.tmp.<pid>.<hex>" beside `name`.
      const std::string file = it->path().filename().string();
      const std::string target = file.substr(1, file.rfind(".tmp.") - 1);
      std::string rel =
          fs::relative(it->path().parent_path() / target, root_, ec2).generic_string();
      if (ec2 || !rel.starts_with(prefix)) continue;
      if (::unlink(it->path().c_str()) == 0) ++removed;
    }
    if (ec) return fs_error(ec, "list", root_.string());
    return removed;
  }

  /// The full path of `name`: `(root() / name).string()`.
  std::string describe(std::string_view name) const { return full_path(name).string(); }

  /// Flushes `name` to disk and drops it from the OS page cache (posix_fadvise DONTNEED), so a
  /// following read measures the device rather than memory. Not part of the storage concept.
  result<void> drop_cache(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    std::string p = describe(name);
    int fd = detail::open_retry(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return detail::os_error(detail::lookup_errc(errno), errno, "open", p);
    detail::unique_fd guard(fd);
    int err = detail::fsync_retry(fd, /*data_only=*/true);
    if (err != 0 && err != EINVAL) return detail::os_error(errc::io, err, "fdatasync", p);
    err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (err != 0) return detail::os_error(errc::io, err, "posix_fadvise(DONTNEED)", p);
    return ok();
  }

  /// `drop_cache` for every file `list(prefix)` names.
  result<void> drop_caches(std::string_view prefix = {}) const {
    CAIRN_TRY_ASSIGN(auto names, list(prefix));
    for (const auto& n : names) CAIRN_TRY(drop_cache(n));
    return ok();
  }

  /// Whether `filename` (a last path component) has the form of `put`'s temporary files,
  /// ".<name>.tmp.<pid>.<16 hex digits>"; such files are hidden from `list`.
  static bool is_temp_name(std::string_view filename) noexcept {
    if (filename.size() < 2 || filename.front() != '.') return false;
    std::size_t t = filename.rfind(".tmp.");
    if (t == std::string_view::npos || t == 0) return false;
    std::string_view rest = filename.substr(t + 5);
    std::size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string_view::npos || rest.size() - dot - 1 != 16) return false;
    for (std::size_t i = 0; i < dot; ++i) {
      if (rest[i] < '0' || rest[i] > '9') return false;
    }
    for (char c : rest.substr(dot + 1)) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
  }

 private:
  std::filesystem::path full_path(std::string_view name) const {
    return root_ / std::filesystem::path(std::string(name));
  }

  static error not_a_file(const std::string& p) {
    error e = make_error(errc::not_found, "no object at " + p + ": it is not a regular file");
    e.file = p;
    return e;
  }

  static error fs_error(const std::error_code& ec, std::string_view op, const std::string& p) {
    if (ec.category() == std::generic_category() || ec.category() == std::system_category()) {
      return detail::os_error(errc::io, ec.value(), op, p);
    }
    error e = make_error(errc::io, std::string(op) + " " + p + ": " + ec.message());
    e.file = p;
    return e;
  }

  // mkdir -p that also fsyncs the parent of every directory it creates, so the new entries are
  // durable once the file inside them is.
  static result<void> make_dirs(const std::string& dir) {
    if (dir.empty()) return ok();
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return ok();
      return detail::os_error(errc::io, ENOTDIR, "create directory", dir);
    }
    if (errno != ENOENT) return detail::os_error(errc::io, errno, "stat", dir);
    std::filesystem::path p(dir);
    std::string parent = p.parent_path().string();
    if (!parent.empty() && parent != dir) CAIRN_TRY(make_dirs(parent));
    if (::mkdir(dir.c_str(), 0777) != 0) {
      int e = errno;
      if (e != EEXIST) return detail::os_error(errc::io, e, "mkdir", dir);
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return detail::os_error(errc::io, ENOTDIR, "create directory", dir);
      }
      return ok();  // created concurrently by someone else, who syncs its parent
    }
    return detail::fsync_dir(parent);
  }

  // The cached read fd of `name` when it still refers to the file at `p`, else a fresh one.
  result<std::shared_ptr<const detail::cached_fd>> open_for_read(const std::string& name,
                                                                 const std::string& p) const {
    if (auto c = cache_->find(name)) {
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino) return c;
      cache_->erase(name, c.get());
    }
    int fd = detail::open_retry(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return detail::os_error(detail::lookup_errc(errno), errno, "open", p);
    detail::unique_fd guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return detail::os_error(errc::io, errno, "fstat", p);
    if (!S_ISREG(st.st_mode)) return not_a_file(p);
    auto c = std::make_shared<const detail::cached_fd>(guard.release(), st.st_dev, st.st_ino);
    cache_->insert(name, c);
    return c;
  }

  std::filesystem::path root_;
  std::unique_ptr<detail::fd_cache> cache_;
};

static_assert(storage<file_storage>);
static_assert(storage_with_temporaries<file_storage>);

}  // namespace cairn
