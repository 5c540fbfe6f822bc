// cairn/format/checksum.hpp: XXH3-64 checksums over fixed-size blocks, so a partial read
// verifies exactly the blocks it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#ifndef XXH_INLINE_ALL
#  define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace cairn {

/// XXH3-64 of a byte range.
inline std::uint64_t checksum(std::span<const std::byte> data) noexcept {
  return XXH3_64bits(data.data(), data.size());
}

/// Checksums of consecutive `block_size`-byte blocks of `data` (the last may be shorter).
/// An empty range has no blocks.
inline std::vector<std::uint64_t> block_checksums(std::span<const std::byte> data,
                                                  std::uint64_t block_size) {
  std::vector<std::uint64_t> out;
  out.reserve((data.size() + block_size - 1) / block_size);
  for (std::uint64_t off = 0; off < data.size(); off += block_size)
    out.push_back(
        checksum(data.subspan(off, std::min<std::uint64_t>(block_size, data.size() - off))));
  return out;
}

/// A checksum as 16 lower-case hex digits.
inline std::string checksum_hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Parses 16 hex digits; nullopt when malformed.
inline std::optional<std::uint64_t> parse_checksum_hex(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= static_cast<std::uint64_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= static_cast<std::uint64_t>(c - 'A' + 10);
    else
      return std::nullopt;
  }
  return v;
}

}  // namespace cairn
