// cairn/core/common_value-inl.hpp: the bodies of cairn/core/common_value.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cairn/core/common_value.hpp"

namespace cairn {

namespace detail {
/// Element `i` of `data` (of dtype `t`) as text.
CAIRN_INLINE std::string element_str(dtype t, const std::byte* p) {
  auto get = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  // The fewest significant digits (at least 6, at most `digits`) that read back as the same
  // value, as a float when `single`: 0.9 rather than 0.90000000000000002.
  auto real = [](double d, int digits, bool single = true) {
    char buf[32];
    for (int p = std::min(digits, 6); p <= digits; ++p) {
      std::snprintf(buf, sizeof buf, "%.*g", p, d);
      const double back = std::strtod(buf, nullptr);
      if (d != d || (single ? static_cast<float>(back) == static_cast<float>(d) : back == d)) break;
    }
    return std::string(buf);
  };
  switch (t) {
    case dtype::bool_:
      return get(std::uint8_t{}) ? "true" : "false";
    case dtype::u8:
      return std::to_string(get(std::uint8_t{}));
    case dtype::i8:
      return std::to_string(get(std::int8_t{}));
    case dtype::i16:
      return std::to_string(get(std::int16_t{}));
    case dtype::u16:
      return std::to_string(get(std::uint16_t{}));
    case dtype::i32:
      return std::to_string(get(std::int32_t{}));
    case dtype::u32:
      return std::to_string(get(std::uint32_t{}));
    case dtype::i64:
      return std::to_string(get(std::int64_t{}));
    case dtype::u64:
      return std::to_string(get(std::uint64_t{}));
    case dtype::f16:
      return real(f16::to_float(get(std::uint16_t{})), 5);
    case dtype::bf16:
      return real(std::bit_cast<float>(static_cast<std::uint32_t>(get(std::uint16_t{})) << 16), 4);
    case dtype::f32:
      return real(get(float{}), 9);
    case dtype::f64:
      return real(get(double{}), 17, false);
    case dtype::f8_e4m3:
    case dtype::f8_e5m2: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(get(std::uint8_t{})));
      return buf;
    }
  }
  return "?";
}
}  // namespace detail

CAIRN_INLINE std::string common_value::str(std::size_t max_chars) const {
  if (kind == common_kind::string) {
    std::string out = "\"";
    std::size_t i = 0;
    for (; i < data.size() && out.size() < max_chars; ++i) {
      auto c = static_cast<unsigned char>(data[i]);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c >= 0x20 && c < 0x7f) {
        out += static_cast<char>(c);
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
    if (i < data.size()) return out + "...\" (" + std::to_string(data.size()) + " bytes)";
    return out + "\"";
  }
  const std::size_t es = dtype_size(type), n = es ? data.size() / es : 0;
  if (kind == common_kind::scalar)
    return n == 1 ? detail::element_str(type, data.data())
                  : "(" + std::to_string(data.size()) + " bytes)";
  std::string out = "[";
  std::size_t i = 0;
  for (; i < n && out.size() < max_chars; ++i) {
    if (i) out += ", ";
    out += detail::element_str(type, data.data() + i * es);
  }
  if (i < n) return out + ", ... (" + std::to_string(n) + " elements)]";
  return out + "]";
}

CAIRN_INLINE std::string common_value::describe_type() const {
  if (kind == common_kind::string) return "string";
  return std::string(dtype_name(type)) + (kind == common_kind::scalar ? " scalar" : " vector");
}

}  // namespace cairn
