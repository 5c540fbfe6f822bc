// tests/system/fuzz/fuzz.hpp: what the fuzz targets share. Each tests/system/fuzz/<target>_fuzz.cpp
// defines LLVMFuzzerTestOneInput; built with libFuzzer (CAIRN_FUZZ=ON, clang) or with
// replay_main.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

namespace cairn_fuzz {

/// The fuzz input as bytes.
inline std::span<const std::byte> bytes(const std::uint8_t* data, std::size_t size) noexcept {
  return {reinterpret_cast<const std::byte*>(data), size};
}

/// The fuzz input as text.
inline std::string_view text(const std::uint8_t* data, std::size_t size) noexcept {
  return {reinterpret_cast<const char*>(data), size};
}

/// Largest tensor a target reads back (callers check a tensor's size against what they expect
/// before reading it; without that check a file may claim any size).
inline constexpr std::uint64_t max_read_bytes = std::uint64_t{1} << 20;

/// A property every accepted input must have; a violation aborts, which libFuzzer reports as a
/// crash with this message.
inline void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "cairn fuzz: property violated: %s\n", what);
  std::abort();
}

}  // namespace cairn_fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
