// cairn/format/detail/format_util.hpp: small helpers shared by the interchange formats
// (safetensors, pickle, torch zip, DCP): errors with file/key/offset, little-endian I/O, JSON
// string escaping, overflow-checked arithmetic on sizes read from files, and buffers that fail
// with an error rather than an exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::format_detail {

/// A corrupt-file error naming the file, the key (may be empty) and the byte offset.
inline error corrupt(std::string message,
                     std::string_view file,
                     std::string_view key = {},
                     std::optional<std::uint64_t> offset = std::nullopt) {
  error e = make_error(errc::corrupt, std::move(message));
  e.file = std::string(file);
  e.key = std::string(key);
  e.offset = offset;
  return e;
}

/// An error of any code naming file, key and offset.
inline error fail(errc code,
                  std::string message,
                  std::string_view file,
                  std::string_view key = {},
                  std::optional<std::uint64_t> offset = std::nullopt) {
  error e = corrupt(std::move(message), file, key, offset);
  e.code = code;
  return e;
}

/// Reads a little-endian unsigned integer of `n` bytes (n <= 8).
inline std::uint64_t load_le(const std::byte* p, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i)
    v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

/// Appends `n` little-endian bytes of `v`.
inline void put_le(std::string& out, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

/// Appends `s` as a JSON string literal, escaped the way serde_json and Python's json do
/// (`"`, `\`, control characters; other UTF-8 passes through).
inline void json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out.push_back(hex[u >> 4]);
          out.push_back(hex[u & 15]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

/// Views a string's characters as bytes.
inline std::span<const std::byte> as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

/// `a + b`, or nullopt when the sum does not fit in 64 bits.
constexpr std::optional<std::uint64_t> add(std::uint64_t a, std::uint64_t b) noexcept {
  if (b > UINT64_MAX - a) return std::nullopt;
  return a + b;
}

/// `a * b`, or nullopt when the product does not fit in 64 bits.
constexpr std::optional<std::uint64_t> mul(std::uint64_t a, std::uint64_t b) noexcept {
  if (a != 0 && b > UINT64_MAX / a) return std::nullopt;
  return a * b;
}

/// The element count of a shape read from a file, whose elements have `elem_size` bytes:
/// `checked_numel`, and also the product of the non-zero extents within `max_tensor_bytes`, so
/// that `numel` and `box::volume` of the shape, and of every box inside it, cannot overflow
/// whatever the order of the factors (`{2^40, 2^40, 0}` has no elements, yet `numel` overflows
/// on the way to 0). nullopt for a negative extent or a size past `max_tensor_bytes`.
inline std::optional<std::int64_t> file_numel(const shape& s, std::size_t elem_size) noexcept {
  auto n = checked_numel(s, elem_size);
  if (!n || *n != 0) return n;
  shape nonzero;
  for (std::int64_t d : s)
    if (d != 0) nonzero.push_back(d);
  if (!checked_numel(nonzero, elem_size)) return std::nullopt;
  return 0;
}

/// A zeroed buffer of `n` bytes, or an `errc::resource` error naming `file` when memory runs out
/// (never throws; `n` must already be checked against the size of what it describes).
inline result<std::vector<std::byte>> buffer(std::uint64_t n,
                                             std::string_view file,
                                             std::string_view key = {}) {
  try {
    if (n > SIZE_MAX) throw std::bad_alloc();
    return std::vector<std::byte>(static_cast<std::size_t>(n));
  } catch (const std::bad_alloc&) {
    return fail(errc::resource, "out of memory allocating " + std::to_string(n) + " bytes", file,
                key);
  } catch (const std::length_error&) {
    return fail(errc::resource, "out of memory allocating " + std::to_string(n) + " bytes", file,
                key);
  }
}

/// Reads `n` bytes at `offset` of object `name` into a new buffer (`errc::resource` when it
/// cannot be allocated).
inline result<std::vector<std::byte>> read_bytes(storage_ref st,
                                                 std::string_view name,
                                                 std::uint64_t offset,
                                                 std::uint64_t n) {
  CAIRN_TRY_ASSIGN(std::vector<std::byte> buf, buffer(n, st.describe(name)));
  CAIRN_TRY(st.read(name, offset, buf));
  return buf;
}

}  // namespace cairn::format_detail
