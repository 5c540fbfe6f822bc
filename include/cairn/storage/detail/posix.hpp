// cairn/storage/detail/posix.hpp: small POSIX helpers for the file backend: errno text, an owning
// fd, positioned I/O loops that survive EINTR and short transfers, and directory fsync.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "cairn/core/error.hpp"

namespace cairn::detail {

/// The symbolic name of an errno value ("ENOENT"), or nullptr for an uncommon one.
inline const char* errno_name(int e) noexcept {
  switch (e) {
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case EINTR:
      return "EINTR";
    case EIO:
      return "EIO";
    case ENXIO:
      return "ENXIO";
    case EBADF:
      return "EBADF";
    case EAGAIN:
      return "EAGAIN";
    case ENOMEM:
      return "ENOMEM";
    case EACCES:
      return "EACCES";
    case EFAULT:
      return "EFAULT";
    case EBUSY:
      return "EBUSY";
    case EEXIST:
      return "EEXIST";
    case EXDEV:
      return "EXDEV";
    case ENODEV:
      return "ENODEV";
    case ENOTDIR:
      return "ENOTDIR";
    case EISDIR:
      return "EISDIR";
    case EINVAL:
      return "EINVAL";
    case ENFILE:
      return "ENFILE";
    case EMFILE:
      return "EMFILE";
    case ETXTBSY:
      return "ETXTBSY";
    case EFBIG:
      return "EFBIG";
    case ENOSPC:
      return "ENOSPC";
    case ESPIPE:
      return "ESPIPE";
    case EROFS:
      return "EROFS";
    case EMLINK:
      return "EMLINK";
    case EPIPE:
      return "EPIPE";
    case ENAMETOOLONG:
      return "ENAMETOOLONG";
    case ENOTEMPTY:
      return "ENOTEMPTY";
    case ELOOP:
      return "ELOOP";
    case EOVERFLOW:
      return "EOVERFLOW";
    case ENOTSUP:
      return "ENOTSUP";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    case ESTALE:
      return "ESTALE";
    case EDQUOT:
      return "EDQUOT";
    case ECANCELED:
      return "ECANCELED";
    default:
      return nullptr;
  }
}

// strerror_r is the XSI (int) or the GNU (char*) variant depending on the C library.
inline std::string strerror_result(int rc, const char* buf) {
  return rc == 0 ? std::string(buf) : std::string("unknown error");
}
inline std::string strerror_result(const char* p, const char*) { return std::string(p); }

/// The OS message and errno name of `e`: "No such file or directory (ENOENT)", or
/// "... (errno 1234)" when the name is not known.
inline std::string errno_text(int e) {
  char buf[256] = {};
  std::string s = strerror_result(::strerror_r(e, buf, sizeof buf), buf);
  const char* n = errno_name(e);
  s += " (";
  s += n ? std::string(n) : "errno " + std::to_string(e);
  s += ')';
  return s;
}

/// The errc for a failed lookup of an object: missing paths are errc::not_found, the rest io.
inline errc lookup_errc(int e) noexcept {
  return (e == ENOENT || e == ENOTDIR) ? errc::not_found : errc::io;
}

/// An error for the failed operation `op` ("open", "pwrite", ...) on `path`, carrying the OS
/// message and errno name: "open /ckpt/a.bin: No such file or directory (ENOENT)".
inline error os_error(errc code, int e, std::string_view op, const std::string& path) {
  error err = make_error(code, std::string(op) + " " + path + ": " + errno_text(e));
  err.file = path;
  return err;
}

/// Owns a file descriptor and closes it on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the fd (errors ignored; use close_fd where they matter).
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// open(2) retried on EINTR; returns the fd or -1 with errno set.
inline int open_retry(const char* path, int flags, mode_t mode = 0) noexcept {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

/// close(2) reporting its error: 0 or an errno. EINTR counts as closed (Linux frees the fd).
inline int close_fd(int fd) noexcept {
  if (::close(fd) != 0 && errno != EINTR) return errno;
  return 0;
}

/// The largest transfer handed to one pread/pwrite: Linux moves at most ~2 GiB per call.
inline constexpr std::size_t max_io_chunk = std::size_t{1} << 30;

/// The largest byte offset + length a positioned transfer may reach.
inline constexpr std::uint64_t max_file_offset = static_cast<std::uint64_t>(INT64_MAX);

/// Writes all `n` bytes at `offset`, looping over EINTR and short writes; 0 or an errno.
/// `done` receives the bytes written before a failure.
inline int pwrite_all(
    int fd, const std::byte* p, std::size_t n, std::uint64_t offset, std::size_t& done) noexcept {
  done = 0;
  while (done < n) {
    std::size_t want = std::min(n - done, max_io_chunk);
    ssize_t w = ::pwrite(fd, p + done, want, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;  // no progress for a non-empty write: the device is full
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

/// Reads up to `n` bytes at `offset`, looping over EINTR and short reads, stopping at end of
/// file; 0 or an errno. `done` receives the bytes read (less than `n` only at end of file).
inline int pread_all(
    int fd, std::byte* p, std::size_t n, std::uint64_t offset, std::size_t& done) noexcept {
  done = 0;
  while (done < n) {
    std::size_t want = std::min(n - done, max_io_chunk);
    ssize_t r = ::pread(fd, p + done, want, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) break;  // end of file
    done += static_cast<std::size_t>(r);
  }
  return 0;
}

/// fsync(2) retried on EINTR; 0 or an errno.
inline int fsync_retry(int fd, bool data_only) noexcept {
  int rc;
  do {
    rc = data_only ? ::fdatasync(fd) : ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

/// Makes the entries of directory `dir` durable (fsync of the directory itself). File systems
/// that cannot sync a directory (EINVAL) are treated as success.
inline result<void> fsync_dir(const std::string& dir) {
  const std::string& d = dir.empty() ? std::string(".") : dir;
  int fd = open_retry(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error(errc::io, errno, "open directory", d);
  unique_fd guard(fd);
  int e = fsync_retry(fd, false);
  if (e != 0 && e != EINVAL) return os_error(errc::io, e, "fsync directory", d);
  return ok();
}

}  // namespace cairn::detail
