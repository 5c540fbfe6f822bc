// cairn/format/detail/format_util.hpp: small helpers shared by the interchange formats
// (safetensors, pickle, torch zip, DCP): errors with file/key/offset, little-endian I/O, JSON
// string escaping, overflow-checked arithmetic on sizes read from files, and buffers that fail
// with an error rather than an exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::format_detail {

/// A corrupt-file error naming the file, the key (may be empty) and the byte offset.
CAIRN_INLINE error corrupt(std::string message,
                           std::string_view file,
                           std::string_view key = {},
                           std::optional<std::uint64_t> offset = std::nullopt);

/// An error of any code naming file, key and offset.
CAIRN_INLINE error fail(errc code,
                        std::string message,
                        std::string_view file,
                        std::string_view key = {},
                        std::optional<std::uint64_t> offset = std::nullopt);

/// Reads a little-endian unsigned integer of `n` bytes (n <= 8).
CAIRN_INLINE std::uint64_t load_le(const std::byte* p, std::size_t n) noexcept;

/// Appends `n` little-endian bytes of `v`.
CAIRN_INLINE void put_le(std::string& out, std::uint64_t v, std::size_t n);

/// Appends `s` as a JSON string literal, escaped the way serde_json and Python's json do
/// (`"`, `\`, control characters; other UTF-8 passes through).
CAIRN_INLINE void json_string(std::string& out, std::string_view s);

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
CAIRN_INLINE std::optional<std::int64_t> file_numel(const shape& s, std::size_t elem_size) noexcept;

/// A zeroed buffer of `n` bytes, or an `errc::resource` error naming `file` when memory runs out
/// (never throws; `n` must already be checked against the size of what it describes).
CAIRN_INLINE result<std::vector<std::byte>> buffer(std::uint64_t n,
                                                   std::string_view file,
                                                   std::string_view key = {});

/// Reads `n` bytes at `offset` of object `name` into a new buffer (`errc::resource` when it
/// cannot be allocated).
CAIRN_INLINE result<std::vector<std::byte>> read_bytes(storage_ref st,
                                                       std::string_view name,
                                                       std::uint64_t offset,
                                                       std::uint64_t n);

}  // namespace cairn::format_detail

#if CAIRN_HEADER_ONLY
#  include "cairn/format/detail/format_util-inl.hpp"
#endif
