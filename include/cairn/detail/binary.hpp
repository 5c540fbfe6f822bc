// cairn/detail/binary.hpp: a compact little-endian encoding for what ranks exchange in
// collectives (leaf descriptions, statuses, checksums), and of errors (a rank's status).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"

namespace cairn::detail {

/// Appends values to a byte buffer.
class binary_writer {
 public:
  void u8(std::uint8_t v) { raw(&v, 1); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  void i64(std::int64_t v) { raw(&v, 8); }
  void str(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void blob(std::span<const std::byte> b) {
    u64(b.size());
    raw(b.data(), b.size());
  }
  void ints(const std::vector<std::int64_t>& v) {
    u64(v.size());
    raw(v.data(), v.size() * 8);
  }
  void u64s(const std::vector<std::uint64_t>& v) {
    u64(v.size());
    raw(v.data(), v.size() * 8);
  }
  std::vector<std::byte>& data() noexcept { return buf_; }

 private:
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<std::byte> buf_;
};

/// Reads values written by binary_writer; throws cairn::exception (errc::comm) on underflow,
/// which means ranks disagree about the protocol.
class binary_reader {
 public:
  explicit binary_reader(std::span<const std::byte> b) : b_(b) {}
  std::uint8_t u8() {
    std::uint8_t v;
    raw(&v, 1);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v;
    raw(&v, 8);
    return v;
  }
  std::int64_t i64() {
    std::int64_t v;
    raw(&v, 8);
    return v;
  }
  std::string str() {
    std::string s(checked_len(u64(), 1), '\0');
    raw(s.data(), s.size());
    return s;
  }
  std::vector<std::byte> blob() {
    std::vector<std::byte> v(checked_len(u64(), 1));
    raw(v.data(), v.size());
    return v;
  }
  std::vector<std::int64_t> ints() {
    std::vector<std::int64_t> v(checked_len(u64(), 8));
    raw(v.data(), v.size() * 8);
    return v;
  }
  std::vector<std::uint64_t> u64s() {
    std::vector<std::uint64_t> v(checked_len(u64(), 8));
    raw(v.data(), v.size() * 8);
    return v;
  }
  bool done() const noexcept { return pos_ == b_.size(); }

 private:
  std::size_t checked_len(std::uint64_t n, std::size_t elem) {
    if (n > (b_.size() - pos_) / elem) underflow();
    return static_cast<std::size_t>(n);
  }
  void raw(void* p, std::size_t n) {
    if (n > b_.size() - pos_) underflow();
    if (n) std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
  }
  [[noreturn]] static void underflow() {
    throw exception(make_error(errc::comm, "malformed message between ranks (truncated)"));
  }
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
};

/// Appends an optional error (a rank's status) to `w`.
inline void put_error(binary_writer& w, const std::optional<error>& e) {
  w.u8(e ? 1 : 0);
  if (!e) return;
  w.u8(static_cast<std::uint8_t>(e->code));
  w.str(e->message);
  w.str(e->key);
  w.i64(e->rank);
  w.str(e->file);
  w.u8(e->offset ? 1 : 0);
  w.u64(e->offset.value_or(0));
}

/// Reads an optional error written by `put_error`.
inline std::optional<error> get_error(binary_reader& r) {
  if (!r.u8()) return std::nullopt;
  error e;
  e.code = static_cast<errc>(r.u8());
  e.message = r.str();
  e.key = r.str();
  e.rank = static_cast<int>(r.i64());
  e.file = r.str();
  bool has = r.u8();
  std::uint64_t off = r.u64();
  if (has) e.offset = off;
  return e;
}

}  // namespace cairn::detail
