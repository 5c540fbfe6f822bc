// cairn/storage/file-inl.hpp: the bodies of cairn/storage/file.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "cairn/storage/file.hpp"
#include "cairn/storage/names.hpp"

namespace cairn::detail {

CAIRN_INLINE cached_fd::~cached_fd() {
  if (fd >= 0) ::close(fd);
}

CAIRN_INLINE std::shared_ptr<const cached_fd> fd_cache::find(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = map_.find(name);
  if (it == map_.end()) return nullptr;
  it->second.last_use = ++tick_;
  return it->second.fd;
}

CAIRN_INLINE void fd_cache::insert(const std::string& name, std::shared_ptr<const cached_fd> fd) {
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

CAIRN_INLINE void fd_cache::erase(const std::string& name, const cached_fd* only) {
  std::lock_guard lock(mu_);
  auto it = map_.find(name);
  if (it != map_.end() && (only == nullptr || it->second.fd.get() == only)) map_.erase(it);
}

CAIRN_INLINE void fd_cache::clear() {
  std::lock_guard lock(mu_);
  map_.clear();
}

CAIRN_INLINE std::string temp_suffix() {
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

CAIRN_INLINE result<void> file_writer::write_at(std::uint64_t offset,
                                                std::span<const std::byte> data) {
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
    (void)::sync_file_range(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(data.size()),
                            SYNC_FILE_RANGE_WRITE);
#endif
  return ok();
}

CAIRN_INLINE result<void> file_writer::finish() {
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

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> file_storage::put(std::string_view name,
                                            std::span<const std::byte> data) {
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

CAIRN_INLINE result<std::unique_ptr<object_writer>> file_storage::open_writer(
    std::string_view name) {
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

CAIRN_INLINE result<void> file_storage::read(std::string_view name,
                                             std::uint64_t offset,
                                             std::span<std::byte> out) const {
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
  std::uint64_t file_end = offset + done;  // where pread met the end of the file
  if (done == 0) {
    // Nothing read: the read may have started past the end, which only the file's size tells.
    struct stat st {};
    if (::fstat(f->fd, &st) != 0) return detail::os_error(errc::io, errno, "fstat", p);
    file_end = static_cast<std::uint64_t>(st.st_size);
    if (out.empty()) short_read = offset > file_end;
  }
  if (short_read) {
    error e =
        make_error(errc::corrupt, "truncated: reading " + std::to_string(out.size()) +
                                      " bytes at offset " + std::to_string(offset) + " of " + p +
                                      ", the file ends at byte " + std::to_string(file_end));
    e.file = p;
    e.offset = offset + done;
    return e;
  }
  return ok();
}

CAIRN_INLINE result<std::uint64_t> file_storage::size(std::string_view name) const {
  CAIRN_TRY(check_object_name(name));
  std::string p = describe(name);
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0)
    return detail::os_error(detail::lookup_errc(errno), errno, "stat", p);
  if (!S_ISREG(st.st_mode)) return not_a_file(p);
  return static_cast<std::uint64_t>(st.st_size);
}

CAIRN_INLINE result<bool> file_storage::exists(std::string_view name) const {
  CAIRN_TRY(check_object_name(name));
  std::string p = describe(name);
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return detail::os_error(errc::io, errno, "stat", p);
  }
  return S_ISREG(st.st_mode);
}

CAIRN_INLINE result<std::vector<std::string>> file_storage::list(std::string_view prefix) const {
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

CAIRN_INLINE result<void> file_storage::remove(std::string_view name) {
  CAIRN_TRY(check_object_name(name));
  std::string p = describe(name);
  cache_->erase(std::string(name));
  if (::unlink(p.c_str()) != 0) {
    return detail::os_error(detail::lookup_errc(errno), errno, "unlink", p);
  }
  return ok();
}

CAIRN_INLINE result<std::size_t> file_storage::remove_temporaries(std::string_view prefix) {
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
    std::string rel = fs::relative(it->path().parent_path() / target, root_, ec2).generic_string();
    if (ec2 || !rel.starts_with(prefix)) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  if (ec) return fs_error(ec, "list", root_.string());
  return removed;
}

CAIRN_INLINE result<void> file_storage::drop_cache(std::string_view name) const {
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

CAIRN_INLINE result<void> file_storage::drop_caches(std::string_view prefix) const {
  CAIRN_TRY_ASSIGN(auto names, list(prefix));
  for (const auto& n : names) CAIRN_TRY(drop_cache(n));
  return ok();
}

CAIRN_INLINE bool file_storage::is_temp_name(std::string_view filename) noexcept {
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

CAIRN_INLINE error file_storage::not_a_file(const std::string& p) {
  error e = make_error(errc::not_found, "no object at " + p + ": it is not a regular file");
  e.file = p;
  return e;
}

CAIRN_INLINE error file_storage::fs_error(const std::error_code& ec,
                                          std::string_view op,
                                          const std::string& p) {
  if (ec.category() == std::generic_category() || ec.category() == std::system_category()) {
    return detail::os_error(errc::io, ec.value(), op, p);
  }
  error e = make_error(errc::io, std::string(op) + " " + p + ": " + ec.message());
  e.file = p;
  return e;
}

CAIRN_INLINE result<void> file_storage::make_dirs(const std::string& dir) {
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

CAIRN_INLINE result<std::shared_ptr<const detail::cached_fd>> file_storage::open_for_read(
    const std::string& name, const std::string& p) const {
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

}  // namespace cairn
