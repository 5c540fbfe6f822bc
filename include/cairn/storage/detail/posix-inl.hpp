// cairn/storage/detail/posix-inl.hpp: the bodies of cairn/storage/detail/posix.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cairn/storage/detail/posix.hpp"

namespace cairn::detail {

CAIRN_INLINE const char* errno_name(int e) noexcept {
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

CAIRN_INLINE std::string errno_text(int e) {
  char buf[256] = {};
  std::string s = strerror_result(::strerror_r(e, buf, sizeof buf), buf);
  const char* n = errno_name(e);
  s += " (";
  s += n ? std::string(n) : "errno " + std::to_string(e);
  s += ')';
  return s;
}

CAIRN_INLINE error os_error(errc code, int e, std::string_view op, const std::string& path) {
  error err = make_error(code, std::string(op) + " " + path + ": " + errno_text(e));
  err.file = path;
  return err;
}

CAIRN_INLINE unique_fd& unique_fd::operator=(unique_fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

CAIRN_INLINE void unique_fd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

CAIRN_INLINE int open_retry(const char* path, int flags, mode_t mode) noexcept {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

CAIRN_INLINE int close_fd(int fd) noexcept {
  if (::close(fd) != 0 && errno != EINTR) return errno;
  return 0;
}

CAIRN_INLINE int pwrite_all(
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

CAIRN_INLINE int pread_all(
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

CAIRN_INLINE int fsync_retry(int fd, bool data_only) noexcept {
  int rc;
  do {
    rc = data_only ? ::fdatasync(fd) : ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

CAIRN_INLINE result<void> fsync_dir(const std::string& dir) {
  const std::string& d = dir.empty() ? std::string(".") : dir;
  int fd = open_retry(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error(errc::io, errno, "open directory", d);
  unique_fd guard(fd);
  int e = fsync_retry(fd, false);
  if (e != 0 && e != EINVAL) return os_error(errc::io, e, "fsync directory", d);
  return ok();
}

}  // namespace cairn::detail
