// cairn/core/checksum.hpp: XXH3-64 checksums over fixed-size blocks, so a partial read
// verifies exactly the blocks it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/detail/config.hpp"

namespace cairn {

/// XXH3-64 of a byte range.
CAIRN_INLINE std::uint64_t checksum(std::span<const std::byte> data) noexcept;

/// Checksums of consecutive `block_size`-byte blocks of `data` (the last may be shorter).
/// An empty range has no blocks; a `block_size` of 0 makes the whole range one block.
CAIRN_INLINE std::vector<std::uint64_t> block_checksums(std::span<const std::byte> data,
                                                        std::uint64_t block_size);

/// A checksum as 16 lower-case hex digits.
CAIRN_INLINE std::string checksum_hex(std::uint64_t v);

/// Parses 16 hex digits; nullopt when malformed.
CAIRN_INLINE std::optional<std::uint64_t> parse_checksum_hex(std::string_view s);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/checksum-inl.hpp"
#endif
