// cairn/storage/writer_slots-inl.hpp: the bodies of cairn/storage/writer_slots.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "cairn/storage/writer_slots.hpp"

namespace cairn {

CAIRN_INLINE writer_slot& writer_slot::operator=(writer_slot&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

CAIRN_INLINE void writer_slot::release() noexcept {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
  fd_ = -1;
}

CAIRN_INLINE writer_slot writer_slots::acquire() const {
  if (limit_ <= 0) return {};
  if (limit_ == 1) return acquire_blocking(lock_path(0));
  for (int attempt = 0;; ++attempt) {
    for (int k = 0; k < limit_; ++k) {
      int fd = ::open(lock_path(k).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd < 0) return {};
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return writer_slot(fd);
      ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 20 ? 1 : 10));
  }
}

CAIRN_INLINE writer_slot writer_slots::acquire_blocking(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return {};
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(fd);
      return {};
    }
  }
  return writer_slot(fd);
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<void> slotted_writer::write_at(std::uint64_t offset,
                                                   std::span<const std::byte> data) {
  writer_slot slot = slots_.acquire();
  return inner_->write_at(offset, data);
}

CAIRN_INLINE result<void> slotted_writer::finish() {
  writer_slot slot = slots_.acquire();
  return inner_->finish();
}

}  // namespace cairn::detail
