// cairn/detail/binary-inl.hpp: the bodies of cairn/detail/binary.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cstring>

#include "cairn/detail/binary.hpp"

namespace cairn::detail {

CAIRN_INLINE void binary_writer::str(std::string_view s) {
  u64(s.size());
  raw(s.data(), s.size());
}

CAIRN_INLINE void binary_writer::blob(std::span<const std::byte> b) {
  u64(b.size());
  raw(b.data(), b.size());
}

CAIRN_INLINE void binary_writer::ints(const std::vector<std::int64_t>& v) {
  u64(v.size());
  raw(v.data(), v.size() * 8);
}

CAIRN_INLINE void binary_writer::u64s(const std::vector<std::uint64_t>& v) {
  u64(v.size());
  raw(v.data(), v.size() * 8);
}

CAIRN_INLINE void binary_writer::raw(const void* p, std::size_t n) {
  auto* b = static_cast<const std::byte*>(p);
  buf_.insert(buf_.end(), b, b + n);
}

CAIRN_INLINE std::uint8_t binary_reader::u8() {
  std::uint8_t v;
  raw(&v, 1);
  return v;
}

CAIRN_INLINE std::uint64_t binary_reader::u64() {
  std::uint64_t v;
  raw(&v, 8);
  return v;
}

CAIRN_INLINE std::int64_t binary_reader::i64() {
  std::int64_t v;
  raw(&v, 8);
  return v;
}

CAIRN_INLINE std::string binary_reader::str() {
  std::string s(checked_len(u64(), 1), '\0');
  raw(s.data(), s.size());
  return s;
}

CAIRN_INLINE std::vector<std::byte> binary_reader::blob() {
  std::vector<std::byte> v(checked_len(u64(), 1));
  raw(v.data(), v.size());
  return v;
}

CAIRN_INLINE std::vector<std::int64_t> binary_reader::ints() {
  std::vector<std::int64_t> v(checked_len(u64(), 8));
  raw(v.data(), v.size() * 8);
  return v;
}

CAIRN_INLINE std::vector<std::uint64_t> binary_reader::u64s() {
  std::vector<std::uint64_t> v(checked_len(u64(), 8));
  raw(v.data(), v.size() * 8);
  return v;
}

CAIRN_INLINE std::size_t binary_reader::checked_len(std::uint64_t n, std::size_t elem) {
  if (n > (b_.size() - pos_) / elem) underflow();
  return static_cast<std::size_t>(n);
}

CAIRN_INLINE void binary_reader::raw(void* p, std::size_t n) {
  if (n > b_.size() - pos_) underflow();
  if (n) std::memcpy(p, b_.data() + pos_, n);
  pos_ += n;
}

CAIRN_INLINE void put_error(binary_writer& w, const std::optional<error>& e) {
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

CAIRN_INLINE std::optional<error> get_error(binary_reader& r) {
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
