// cairn/storage/detail/posix.hpp: small POSIX helpers for the file backend: errno text, an owning
// fd, positioned I/O loops that survive EINTR and short transfers, and directory fsync.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::detail {

/// The symbolic name of an errno value ("ENOENT"), or nullptr for an uncommon one.
CAIRN_INLINE const char* errno_name(int e) noexcept;

// strerror_r is the XSI (int) or the GNU (char*) variant depending on the C library.
inline std::string strerror_result(int rc, const char* buf) {
  return rc == 0 ? std::string(buf) : std::string("unknown error");
}
inline std::string strerror_result(const char* p, const char*) { return std::string(p); }

/// The OS message and errno name of `e`: "No such file or directory (ENOENT)", or
/// "... (errno 1234)" when the name is not known.
CAIRN_INLINE std::string errno_text(int e);

/// The errc for a failed lookup of an object: missing paths are errc::not_found, the rest io.
inline errc lookup_errc(int e) noexcept {
  return (e == ENOENT || e == ENOTDIR) ? errc::not_found : errc::io;
}

/// An error for the failed operation `op` ("open", "pwrite", ...) on `path`, carrying the OS
/// message and errno name: "open /ckpt/a.bin: No such file or directory (ENOENT)".
CAIRN_INLINE error os_error(errc code, int e, std::string_view op, const std::string& path);

/// Owns a file descriptor and closes it on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept;
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the fd (errors ignored; use close_fd where they matter).
  void reset() noexcept;

 private:
  int fd_ = -1;
};

/// open(2) retried on EINTR; returns the fd or -1 with errno set.
CAIRN_INLINE int open_retry(const char* path, int flags, mode_t mode = 0) noexcept;

/// close(2) reporting its error: 0 or an errno. EINTR counts as closed (Linux frees the fd).
CAIRN_INLINE int close_fd(int fd) noexcept;

/// The largest transfer handed to one pread/pwrite: Linux moves at most ~2 GiB per call.
inline constexpr std::size_t max_io_chunk = std::size_t{1} << 30;

/// The largest byte offset + length a positioned transfer may reach.
inline constexpr std::uint64_t max_file_offset = static_cast<std::uint64_t>(INT64_MAX);

/// Writes all `n` bytes at `offset`, looping over EINTR and short writes; 0 or an errno.
/// `done` receives the bytes written before a failure.
CAIRN_INLINE int pwrite_all(
    int fd, const std::byte* p, std::size_t n, std::uint64_t offset, std::size_t& done) noexcept;

/// Reads up to `n` bytes at `offset`, looping over EINTR and short reads, stopping at end of
/// file; 0 or an errno. `done` receives the bytes read (less than `n` only at end of file).
CAIRN_INLINE int pread_all(
    int fd, std::byte* p, std::size_t n, std::uint64_t offset, std::size_t& done) noexcept;

/// fsync(2) retried on EINTR; 0 or an errno.
CAIRN_INLINE int fsync_retry(int fd, bool data_only) noexcept;

/// Makes the entries of directory `dir` durable (fsync of the directory itself). File systems
/// that cannot sync a directory (EINVAL) are treated as success.
CAIRN_INLINE result<void> fsync_dir(const std::string& dir);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/detail/posix-inl.hpp"
#endif
