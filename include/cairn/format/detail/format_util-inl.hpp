// cairn/format/detail/format_util-inl.hpp: the bodies of cairn/format/detail/format_util.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cstring>
#include <new>
#include <stdexcept>

#include "cairn/format/detail/format_util.hpp"

namespace cairn::format_detail {

CAIRN_INLINE error corrupt(std::string message,
                           std::string_view file,
                           std::string_view key,
                           std::optional<std::uint64_t> offset) {
  error e = make_error(errc::corrupt, std::move(message));
  e.file = std::string(file);
  e.key = std::string(key);
  e.offset = offset;
  return e;
}

CAIRN_INLINE error fail(errc code,
                        std::string message,
                        std::string_view file,
                        std::string_view key,
                        std::optional<std::uint64_t> offset) {
  error e = corrupt(std::move(message), file, key, offset);
  e.code = code;
  return e;
}

CAIRN_INLINE std::uint64_t load_le(const std::byte* p, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i)
    v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

CAIRN_INLINE void put_le(std::string& out, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

CAIRN_INLINE void json_string(std::string& out, std::string_view s) {
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

CAIRN_INLINE std::optional<std::int64_t> file_numel(const shape& s,
                                                    std::size_t elem_size) noexcept {
  auto n = checked_numel(s, elem_size);
  if (!n || *n != 0) return n;
  shape nonzero;
  for (std::int64_t d : s)
    if (d != 0) nonzero.push_back(d);
  if (!checked_numel(nonzero, elem_size)) return std::nullopt;
  return 0;
}

CAIRN_INLINE result<std::vector<std::byte>> buffer(std::uint64_t n,
                                                   std::string_view file,
                                                   std::string_view key) {
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

CAIRN_INLINE result<std::vector<std::byte>> read_bytes(storage_ref st,
                                                       std::string_view name,
                                                       std::uint64_t offset,
                                                       std::uint64_t n) {
  CAIRN_TRY_ASSIGN(std::vector<std::byte> buf, buffer(n, st.describe(name)));
  CAIRN_TRY(st.read(name, offset, buf));
  return buf;
}

}  // namespace cairn::format_detail
