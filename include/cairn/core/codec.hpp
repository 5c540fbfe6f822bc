// cairn/core/codec.hpp: how values become bytes and back (sharded objects, common values).
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cairn/core/error.hpp"

namespace cairn {

/// Encodes `T` to bytes and decodes it back. Provided for trivially copyable types (their
/// object representation), `std::string`, and `std::vector` of trivially copyable types.
/// Specialize it for your own types:
///
///     template <> struct cairn::codec<my_rng> {
///       static std::vector<std::byte> encode(const my_rng&);
///       static cairn::result<void> decode(std::span<const std::byte>, my_rng& out);
///     };
template <class T, class = void>
struct codec;

/// True when cairn knows how to encode and decode `T`.
template <class T>
concept encodable = requires(const T& v, T& out, std::span<const std::byte> in) {
  { codec<T>::encode(v) } -> std::same_as<std::vector<std::byte>>;
  { codec<T>::decode(in, out) } -> std::same_as<result<void>>;
};

template <class T>
struct codec<T, std::enable_if_t<std::is_trivially_copyable_v<T>>> {
  static std::vector<std::byte> encode(const T& v) {
    std::vector<std::byte> out(sizeof(T));
    std::memcpy(out.data(), &v, sizeof(T));
    return out;
  }
  static result<void> decode(std::span<const std::byte> in, T& out) {
    if (in.size() != sizeof(T))
      return make_error(errc::mismatch, "stored value has " + std::to_string(in.size()) +
                                            " bytes, the target type has " +
                                            std::to_string(sizeof(T)));
    std::memcpy(&out, in.data(), sizeof(T));
    return ok();
  }
};

template <>
struct codec<std::string> {
  static std::vector<std::byte> encode(const std::string& v) {
    auto b = std::as_bytes(std::span(v));
    return {b.begin(), b.end()};
  }
  static result<void> decode(std::span<const std::byte> in, std::string& out) {
    out.assign(reinterpret_cast<const char*>(in.data()), in.size());
    return ok();
  }
};

template <class T>
struct codec<std::vector<T>, std::enable_if_t<std::is_trivially_copyable_v<T>>> {
  static std::vector<std::byte> encode(const std::vector<T>& v) {
    auto b = std::as_bytes(std::span(v));
    return {b.begin(), b.end()};
  }
  static result<void> decode(std::span<const std::byte> in, std::vector<T>& out) {
    if (in.size() % sizeof(T) != 0)
      return make_error(errc::mismatch, "stored vector of " + std::to_string(in.size()) +
                                            " bytes is not a whole number of " +
                                            std::to_string(sizeof(T)) + "-byte elements");
    out.resize(in.size() / sizeof(T));
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return ok();
  }
};

}  // namespace cairn
