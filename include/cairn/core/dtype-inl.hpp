// cairn/core/dtype-inl.hpp: the bodies of cairn/core/dtype.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <bit>
#include <cstring>
#include <span>

#include "cairn/core/dtype.hpp"

namespace cairn {

CAIRN_INLINE std::uint16_t f16::from_float(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    int shift = 14 - e;
    std::uint32_t half = man >> shift;
    std::uint32_t rem = man & ((1u << shift) - 1);
    std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

CAIRN_INLINE float f16::to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400u));
      out = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  return std::bit_cast<float>(out);
}

CAIRN_INLINE bf16::bf16(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    bits = static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  } else {
    x += 0x7fffu + ((x >> 16) & 1u);
    bits = static_cast<std::uint16_t>(x >> 16);
  }
}

CAIRN_INLINE void convert_elements(dtype from,
                                   dtype to,
                                   std::span<const std::byte> in,
                                   std::span<std::byte> out) {
  const std::size_t n = in.size() / dtype_size(from);
  const std::size_t ei = dtype_size(from), eo = dtype_size(to);
  // 16- and 32-bit values go through float (bit-exact, NaN payloads kept); only F64 on either
  // side goes through double.
  auto load_f = [&](const std::byte* p) -> float {
    std::uint16_t h;
    float f;
    double d;
    switch (from) {
      case dtype::f16:
        std::memcpy(&h, p, 2);
        return f16::to_float(h);
      case dtype::bf16:
        std::memcpy(&h, p, 2);
        return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
      case dtype::f32:
        std::memcpy(&f, p, 4);
        return f;
      default:
        std::memcpy(&d, p, 8);
        return static_cast<float>(d);
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* p = in.data() + i * ei;
    std::byte* q = out.data() + i * eo;
    if (to == dtype::f64) {
      double v;
      if (from == dtype::f64)
        std::memcpy(&v, p, 8);
      else
        v = static_cast<double>(load_f(p));
      std::memcpy(q, &v, 8);
      continue;
    }
    float v = load_f(p);
    if (to == dtype::f32) {
      std::memcpy(q, &v, 4);
    } else {
      std::uint16_t h = to == dtype::f16 ? f16::from_float(v) : bf16(v).bits;
      std::memcpy(q, &h, 2);
    }
  }
}

}  // namespace cairn
