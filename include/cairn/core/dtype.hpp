// cairn/core/dtype.hpp: element types, their safetensors names and sizes, and the C++ types
// that map to them.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

#include "cairn/detail/config.hpp"

namespace cairn {

/// Element type of a tensor. Names follow safetensors ("F32", "BF16", "F8_E4M3", ...).
enum class dtype : std::uint8_t {
  bool_,
  u8,
  i8,
  i16,
  u16,
  i32,
  u32,
  i64,
  u64,
  f16,
  bf16,
  f32,
  f64,
  f8_e4m3,
  f8_e5m2,
};

/// Every dtype, in declaration order (handy for tests and tables).
inline constexpr std::array<dtype, 15> all_dtypes = {
    dtype::bool_, dtype::u8,  dtype::i8,  dtype::i16,     dtype::u16,
    dtype::i32,   dtype::u32, dtype::i64, dtype::u64,     dtype::f16,
    dtype::bf16,  dtype::f32, dtype::f64, dtype::f8_e4m3, dtype::f8_e5m2};

/// Size of one element in bytes.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
    case dtype::u8:
    case dtype::i8:
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:
      return 1;
    case dtype::i16:
    case dtype::u16:
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::i32:
    case dtype::u32:
    case dtype::f32:
      return 4;
    case dtype::i64:
    case dtype::u64:
    case dtype::f64:
      return 8;
  }
  return 0;
}

/// The safetensors name of a dtype, e.g. "F32".
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
      return "BOOL";
    case dtype::u8:
      return "U8";
    case dtype::i8:
      return "I8";
    case dtype::i16:
      return "I16";
    case dtype::u16:
      return "U16";
    case dtype::i32:
      return "I32";
    case dtype::u32:
      return "U32";
    case dtype::i64:
      return "I64";
    case dtype::u64:
      return "U64";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    case dtype::f32:
      return "F32";
    case dtype::f64:
      return "F64";
    case dtype::f8_e4m3:
      return "F8_E4M3";
    case dtype::f8_e5m2:
      return "F8_E5M2";
  }
  return "?";
}

/// Parses a safetensors dtype name; nullopt for unknown names.
constexpr std::optional<dtype> dtype_from_name(std::string_view name) noexcept {
  for (dtype t : all_dtypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

/// IEEE half precision, stored as its bits. Converts to and from float.
struct f16 {
  std::uint16_t bits = 0;
  f16() = default;
  /// Rounds to nearest even; overflow becomes infinity.
  explicit f16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  friend bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }

  static std::uint16_t from_float(float f) noexcept;
  static float to_float(std::uint16_t h) noexcept;
};

/// bfloat16, stored as its bits. Converts to and from float (round to nearest even).
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) noexcept;
  explicit operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

/// FP8 E4M3 (torch float8_e4m3fn), stored as its bits.
struct f8_e4m3 {
  std::uint8_t bits = 0;
  friend bool operator==(f8_e4m3 a, f8_e4m3 b) noexcept { return a.bits == b.bits; }
};

/// FP8 E5M2, stored as its bits.
struct f8_e5m2 {
  std::uint8_t bits = 0;
  friend bool operator==(f8_e5m2 a, f8_e5m2 b) noexcept { return a.bits == b.bits; }
};

/// True for the floating dtypes `convert_elements` converts between (f16, bf16, f32, f64).
constexpr bool convertible_float(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}

/// Converts `in` (elements of `from`) into `out` (the same count of `to`). Widening
/// (F16/BF16 -> F32/F64, F32 -> F64) is exact; narrowing rounds to nearest even.
CAIRN_INLINE void convert_elements(dtype from,
                                   dtype to,
                                   std::span<const std::byte> in,
                                   std::span<std::byte> out);

namespace detail {
template <class T>
struct dtype_of_impl {};
template <>
struct dtype_of_impl<bool> : std::integral_constant<dtype, dtype::bool_> {};
template <>
struct dtype_of_impl<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
template <>
struct dtype_of_impl<std::int8_t> : std::integral_constant<dtype, dtype::i8> {};
template <>
struct dtype_of_impl<std::int16_t> : std::integral_constant<dtype, dtype::i16> {};
template <>
struct dtype_of_impl<std::uint16_t> : std::integral_constant<dtype, dtype::u16> {};
template <>
struct dtype_of_impl<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <>
struct dtype_of_impl<std::uint32_t> : std::integral_constant<dtype, dtype::u32> {};
template <>
struct dtype_of_impl<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <>
struct dtype_of_impl<std::uint64_t> : std::integral_constant<dtype, dtype::u64> {};
template <>
struct dtype_of_impl<f16> : std::integral_constant<dtype, dtype::f16> {};
template <>
struct dtype_of_impl<bf16> : std::integral_constant<dtype, dtype::bf16> {};
template <>
struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of_impl<f8_e4m3> : std::integral_constant<dtype, dtype::f8_e4m3> {};
template <>
struct dtype_of_impl<f8_e5m2> : std::integral_constant<dtype, dtype::f8_e5m2> {};
}  // namespace detail

/// True for C++ element types that have a cairn dtype.
template <class T>
concept element_type = requires {
  detail::dtype_of_impl<std::remove_cv_t<T>>::value;
};

/// The dtype of a C++ element type: `dtype_of<float> == dtype::f32`.
template <element_type T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2 && sizeof(f8_e4m3) == 1);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/dtype-inl.hpp"
#endif
