// cairn/core/common_value.hpp: values that are identical on every rank that declares them
// (numbers, strings, enums, vectors of numbers), written once into the common state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

/// What a common value holds.
enum class common_kind : std::uint8_t {
  scalar,  ///< one number, bool or enum (stored as its dtype)
  vector,  ///< a vector of numbers
  string,  ///< UTF-8 or arbitrary bytes
};

namespace detail {
template <class T>
constexpr dtype scalar_dtype() {
  if constexpr (std::is_enum_v<T>) {
    return scalar_dtype<std::underlying_type_t<T>>();
  } else if constexpr (std::is_same_v<T, bool>) {
    return dtype::bool_;
  } else if constexpr (std::is_floating_point_v<T>) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cairn: long double is not supported");
    return sizeof(T) == 4 ? dtype::f32 : dtype::f64;
  } else if constexpr (element_type<T>) {
    return dtype_of<T>;
  } else {
    static_assert(std::is_integral_v<T>);
    constexpr bool s = std::is_signed_v<T>;
    switch (sizeof(T)) {
      case 1:
        return s ? dtype::i8 : dtype::u8;
      case 2:
        return s ? dtype::i16 : dtype::u16;
      case 4:
        return s ? dtype::i32 : dtype::u32;
      default:
        return s ? dtype::i64 : dtype::u64;
    }
  }
}
template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {
  using element = T;
};
template <class T>
constexpr bool is_scalar_vector() {
  if constexpr (is_std_vector<T>::value) {
    using E = typename is_std_vector<T>::element;
    // std::vector<bool> has no contiguous storage to view as bytes.
    return (std::is_arithmetic_v<E> || std::is_enum_v<E> ||
            element_type<E>)&&!std::is_same_v<E, bool>;
  } else {
    return false;
  }
}
/// True for std::vector of scalars (except std::vector<bool>).
template <class T>
concept scalar_vector = is_scalar_vector<T>();
}  // namespace detail

/// Scalar types a common value can hold: arithmetic types, enums and cairn element types.
template <class T>
concept common_scalar = std::is_arithmetic_v<T> || std::is_enum_v<T> || element_type<T>;

/// C++ types that are saved as one common value: scalars, std::string, std::vector of scalars.
template <class T>
concept common_type =
    common_scalar<T> || std::is_same_v<T, std::string> || detail::scalar_vector<T>;

/// A dynamically typed common value: kind, dtype (for scalars and vectors) and raw bytes.
struct common_value {
  common_kind kind = common_kind::scalar;
  dtype type = dtype::u8;       ///< element dtype; `u8` for strings
  std::vector<std::byte> data;  ///< little-endian element bytes, or the string's bytes

  /// Wraps a C++ value: `common_value::of(std::int64_t{3})`, `common_value::of("adamw"s)`.
  template <common_type T>
  static common_value of(const T& v) {
    common_value c;
    if constexpr (common_scalar<T>) {
      c.kind = common_kind::scalar;
      c.type = detail::scalar_dtype<T>();
      c.data.resize(sizeof(T));
      std::memcpy(c.data.data(), &v, sizeof(T));
    } else if constexpr (std::is_same_v<T, std::string>) {
      c.kind = common_kind::string;
      c.type = dtype::u8;
      auto b = std::as_bytes(std::span(v));
      c.data.assign(b.begin(), b.end());
    } else {
      using E = typename detail::is_std_vector<T>::element;
      c.kind = common_kind::vector;
      c.type = detail::scalar_dtype<E>();
      auto b = std::as_bytes(std::span(v));
      c.data.assign(b.begin(), b.end());
    }
    return c;
  }

  /// Reads the value into `out`; fails with errc::mismatch when kind or dtype differ (no
  /// silent conversion).
  template <common_type T>
  result<void> get(T& out) const {
    common_value want = of(T{});
    if (want.kind != kind || (kind != common_kind::string && want.type != type))
      return make_error(errc::mismatch, "stored common value is " + describe_type() +
                                            ", the target is " + want.describe_type() +
                                            ": declare the target with the saved type");
    if constexpr (common_scalar<T>) {
      if (data.size() != sizeof(T))
        return make_error(errc::corrupt, "common scalar has " + std::to_string(data.size()) +
                                             " bytes, expected " + std::to_string(sizeof(T)));
      std::memcpy(&out, data.data(), sizeof(T));
    } else if constexpr (std::is_same_v<T, std::string>) {
      out.assign(reinterpret_cast<const char*>(data.data()), data.size());
    } else {
      using E = typename detail::is_std_vector<T>::element;
      if (data.size() % sizeof(E) != 0)
        return make_error(errc::corrupt, "common vector size is not a multiple of its element");
      out.resize(data.size() / sizeof(E));
      if (!data.empty()) std::memcpy(out.data(), data.data(), data.size());
    }
    return ok();
  }

  /// The value as T, or throws cairn::exception.
  template <common_type T>
  T as() const {
    T v{};
    get(v).value();
    return v;
  }

  /// "I64 scalar", "F32 vector", "string".
  std::string describe_type() const;

  /// The value as messages and `cairn inspect` show it, in about `max_chars` characters:
  /// `1000`, `0.25`, `true`, `"adamw"`, `[1, 2, 3]`; longer ones end in `...` and the count
  /// (`[0, 1, 2, ... (4096 elements)]`, `"abc..." (9000 bytes)`).
  std::string str(std::size_t max_chars = 60) const;

  friend bool operator==(const common_value&, const common_value&) = default;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/common_value-inl.hpp"
#endif
