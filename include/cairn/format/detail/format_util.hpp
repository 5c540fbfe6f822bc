// cairn/format/detail/format_util.hpp: small helpers shared by the interchange formats
// (safetensors, pickle, torch zip, DCP): errors with file/key/offset, little-endian I/O, JSON
// string escaping, and a sequential writer over an object_writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
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

/// Reads `n` bytes at `offset` of object `name` into a new buffer.
inline result<std::vector<std::byte>> read_bytes(storage_ref st,
                                                 std::string_view name,
                                                 std::uint64_t offset,
                                                 std::uint64_t n) {
  std::vector<std::byte> buf(static_cast<std::size_t>(n));
  CAIRN_TRY(st.read(name, offset, buf));
  return buf;
}

}  // namespace cairn::format_detail
