// cairn/detail/binary.hpp: a compact little-endian encoding for what ranks exchange in
// collectives (leaf descriptions, statuses, checksums), and of errors (a rank's status).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::detail {

/// Appends values to a byte buffer.
class binary_writer {
 public:
  void u8(std::uint8_t v) { raw(&v, 1); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  void i64(std::int64_t v) { raw(&v, 8); }
  void str(std::string_view s);
  void blob(std::span<const std::byte> b);
  void ints(const std::vector<std::int64_t>& v);
  void u64s(const std::vector<std::uint64_t>& v);
  std::vector<std::byte>& data() noexcept { return buf_; }

 private:
  void raw(const void* p, std::size_t n);
  std::vector<std::byte> buf_;
};

/// Reads values written by binary_writer; throws cairn::exception (errc::comm) on underflow,
/// which means ranks disagree about the protocol.
class binary_reader {
 public:
  explicit binary_reader(std::span<const std::byte> b) : b_(b) {}
  std::uint8_t u8();
  std::uint64_t u64();
  std::int64_t i64();
  std::string str();
  std::vector<std::byte> blob();
  std::vector<std::int64_t> ints();
  std::vector<std::uint64_t> u64s();
  bool done() const noexcept { return pos_ == b_.size(); }

 private:
  std::size_t checked_len(std::uint64_t n, std::size_t elem);
  void raw(void* p, std::size_t n);
  [[noreturn]] static void underflow() {
    throw exception(make_error(errc::comm, "malformed message between ranks (truncated)"));
  }
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
};

/// Appends an optional error (a rank's status) to `w`.
CAIRN_INLINE void put_error(binary_writer& w, const std::optional<error>& e);

/// Reads an optional error written by `put_error`.
CAIRN_INLINE std::optional<error> get_error(binary_reader& r);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/detail/binary-inl.hpp"
#endif
