// cairn/core/checksum-inl.hpp: the bodies of cairn/core/checksum.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION): xxHash's
// XXH3, inlined.
#pragma once

#include <algorithm>
#include <cstdio>

// On x86-64 with GCC or Clang, XXH3's AVX2 kernel is also compiled (with a target attribute)
// and chosen at run time, as xxHash's own xxh_x86dispatch.c does: a baseline x86-64 build
// otherwise hashes with SSE2 at about 60 % of the speed, and every byte cairn saves or loads
// is hashed. The hash values are identical. Skipped when xxHash's implementation is already
// in this translation unit, when AVX2 is on anyway, or with CAIRN_NO_XXH3_DISPATCH.
#if !defined(CAIRN_NO_XXH3_DISPATCH) && !defined(XXH_IMPLEM_13a8737387) && defined(__x86_64__) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__) && !defined(__CUDACC__) &&    \
    !defined(XXH_DISPATCH_AVX2) && !defined(XXH_TARGET_AVX2)
#  include <immintrin.h>
#  define CAIRN_XXH3_DISPATCH_REQUESTED 1
#  ifndef XXH_X86DISPATCH
#    define XXH_X86DISPATCH  // 64-byte aligned accumulators, valid for every kernel
#  endif
#  define XXH_DISPATCH_AVX2 1
#  define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#endif
#ifndef XXH_INLINE_ALL
#  define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <cstdio>

#include "cairn/core/checksum.hpp"

namespace cairn {

namespace detail {
#if defined(CAIRN_XXH3_DISPATCH_REQUESTED) && XXH_VERSION_NUMBER >= 801 && XXH_VERSION_NUMBER <= 803
#  define CAIRN_XXH3_DISPATCH 1
/// XXH3-64 of more than XXH3_MIDSIZE_MAX bytes with the AVX2 kernel (the caller checks AVX2).
__attribute__((__target__("avx2"))) inline std::uint64_t xxh3_long_avx2(const void* p,
                                                                        std::size_t n) noexcept {
#  if XXH_VERSION_NUMBER >= 802
  return XXH3_hashLong_64b_internal(p, n, XXH3_kSecret, sizeof(XXH3_kSecret), XXH3_accumulate_avx2,
                                    XXH3_scrambleAcc_avx2);
#  else
  return XXH3_hashLong_64b_internal(p, n, XXH3_kSecret, sizeof(XXH3_kSecret),
                                    XXH3_accumulate_512_avx2, XXH3_scrambleAcc_avx2);
#  endif
}

/// Whether this CPU and OS run AVX2 code (checked once).
inline bool have_avx2() noexcept {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}
#else
#  define CAIRN_XXH3_DISPATCH 0
#endif
}  // namespace detail

CAIRN_INLINE std::uint64_t checksum(std::span<const std::byte> data) noexcept {
#if CAIRN_XXH3_DISPATCH
  if (data.size() > XXH3_MIDSIZE_MAX && detail::have_avx2())
    return detail::xxh3_long_avx2(data.data(), data.size());
#endif
  return XXH3_64bits(data.data(), data.size());
}

CAIRN_INLINE std::vector<std::uint64_t> block_checksums(std::span<const std::byte> data,
                                                        std::uint64_t block_size) {
  if (block_size == 0) block_size = std::max<std::uint64_t>(data.size(), 1);
  std::vector<std::uint64_t> out;
  out.reserve((data.size() + block_size - 1) / block_size);
  for (std::uint64_t off = 0; off < data.size(); off += block_size)
    out.push_back(
        checksum(data.subspan(off, std::min<std::uint64_t>(block_size, data.size() - off))));
  return out;
}

CAIRN_INLINE std::string checksum_hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

CAIRN_INLINE std::optional<std::uint64_t> parse_checksum_hex(std::string_view s) {
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
