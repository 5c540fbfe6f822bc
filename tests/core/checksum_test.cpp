// tests/core/checksum_test.cpp: cairn/core/checksum.hpp: checksum() against XXH3-64 reference
// values at every input size class (including the run-time dispatched AVX2 kernel for long
// inputs), block_checksums() at block boundaries, and the hex form with its parser's refusals.
#include "cairn/core/checksum.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace checksum_test {

/// Deterministic bytes: byte i is (i * 131 + 7) mod 256.
inline std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131u + 7u) & 0xffu);
  return b;
}

}  // namespace checksum_test

TEST_CASE("checksum is XXH3-64 at every input size class") {
  // Reference values from the system libxxhash 0.8.1 (XXH3_64bits, seed 0) over
  // checksum_test::pattern(n): each XXH3 code path (0, 1-3, 4-8, 9-16, 17-128, 129-240 bytes,
  // and the long-input kernel that cairn dispatches to AVX2 at run time).
  const std::pair<std::size_t, std::uint64_t> refs[] = {
      {0, 0x2d06800538d394c2ull},       {1, 0x4c5cca45d0f4811full},
      {3, 0x6e3e2670e61106acull},       {4, 0x5c4c63133443d03full},
      {8, 0xf9fd4dd0b04d78f5ull},       {9, 0x7c20df9712c26edfull},
      {16, 0x86abf6baccea0858ull},      {17, 0xb58bf5dc5022d071ull},
      {128, 0x10d17f72c0ccba41ull},     {129, 0x1648bdc3db49d1a2ull},
      {240, 0xb6cfaf343fab81e6ull},     {241, 0x956cae592c67279eull},
      {1024, 0x70bd377d9574f4bbull},    {4096, 0x9ddd66c14af0daffull},
      {1000003, 0xeef8740468e373bbull},
  };
  const auto data = checksum_test::pattern(1000003);
  for (auto [n, want] : refs) {
    CAPTURE(n);
    CHECK(cairn::checksum(std::span(data).first(n)) == want);
  }
  const char abc[] = {'a', 'b', 'c'};
  CHECK(cairn::checksum(std::as_bytes(std::span(abc))) == 0x78af5f94892f3950ull);

  // The value depends on the bytes only, not on their address or alignment.
  for (std::size_t shift : {1u, 3u, 7u}) {
    std::vector<std::byte> moved(shift + 4096);
    std::copy_n(data.begin(), 4096, moved.begin() + static_cast<std::ptrdiff_t>(shift));
    CHECK(cairn::checksum(std::span(moved).subspan(shift)) == 0x9ddd66c14af0daffull);
  }
  // One flipped bit anywhere changes it.
  auto flipped = checksum_test::pattern(4096);
  flipped[4095] ^= std::byte{1};
  CHECK(cairn::checksum(flipped) != 0x9ddd66c14af0daffull);
}

TEST_CASE("block_checksums covers the data with whole blocks and one shorter last block") {
  const auto data = checksum_test::pattern(1000);
  auto expect = [&](std::uint64_t block) {
    std::vector<std::uint64_t> out;
    for (std::size_t off = 0; off < data.size(); off += block)
      out.push_back(cairn::checksum(
          std::span(data).subspan(off, std::min<std::size_t>(block, data.size() - off))));
    return out;
  };
  SUBCASE("last block shorter") {
    auto got = cairn::block_checksums(data, 256);
    REQUIRE(got.size() == 4);
    CHECK(got == expect(256));
    CHECK(got[3] == cairn::checksum(std::span(data).subspan(768)));  // 232 bytes
  }
  SUBCASE("exact multiple: no empty trailing block") {
    auto got = cairn::block_checksums(std::span(data).first(768), 256);
    CHECK(got.size() == 3);
    auto all = expect(256);
    CHECK(got == std::vector<std::uint64_t>(all.begin(), all.begin() + 3));
  }
  SUBCASE("one-byte blocks") {
    auto got = cairn::block_checksums(std::span(data).first(5), 1);
    REQUIRE(got.size() == 5);
    for (std::size_t i = 0; i < 5; ++i)
      CHECK(got[i] == cairn::checksum(std::span(data).subspan(i, 1)));
  }
  SUBCASE("a block larger than the data, up to the largest size, is one block") {
    for (std::uint64_t block : {std::uint64_t{1000}, std::uint64_t{1001}, std::uint64_t{1} << 40,
                                std::numeric_limits<std::uint64_t>::max()}) {
      CAPTURE(block);
      CHECK(cairn::block_checksums(data, block) ==
            std::vector<std::uint64_t>{cairn::checksum(data)});
    }
  }
  SUBCASE("a block size of 0 makes the whole range one block") {
    CHECK(cairn::block_checksums(data, 0) == std::vector<std::uint64_t>{cairn::checksum(data)});
    CHECK(cairn::block_checksums({}, 0).empty());
  }
  SUBCASE("an empty range has no blocks") {
    CHECK(cairn::block_checksums({}, 4096).empty());
    CHECK(cairn::block_checksums({}, std::numeric_limits<std::uint64_t>::max()).empty());
  }
}

TEST_CASE("checksum_hex writes 16 lower-case digits that parse_checksum_hex reads back") {
  CHECK(cairn::checksum_hex(0) == "0000000000000000");
  CHECK(cairn::checksum_hex(1) == "0000000000000001");
  CHECK(cairn::checksum_hex(0xABCDEF0123456789ull) == "abcdef0123456789");
  CHECK(cairn::checksum_hex(std::numeric_limits<std::uint64_t>::max()) == "ffffffffffffffff");
  for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{0x2d06800538d394c2ull},
                          std::uint64_t{1} << 63, std::numeric_limits<std::uint64_t>::max()})
    CHECK(cairn::parse_checksum_hex(cairn::checksum_hex(v)) == v);
  CHECK(cairn::parse_checksum_hex("ABCDEF0123456789") == 0xabcdef0123456789ull);  // upper case
  CHECK(cairn::parse_checksum_hex("aBcDeF0123456789") == 0xabcdef0123456789ull);
}

TEST_CASE("parse_checksum_hex refuses anything but exactly 16 hex digits") {
  const std::string bad[] = {
      "",                   // empty
      "123456789abcdef",    // 15 digits
      "0123456789abcdef0",  // 17 digits
      "0x23456789abcdef0",  // prefix
      "0123456789abcdeg",   // 'g' at the end
      "/123456789abcdef",   // just below '0'
      ":123456789abcdef",   // just above '9'
      "`123456789abcdef",   // just below 'a'
      "@123456789abcdef",   // just below 'A'
      "G123456789abcdef",   // just above 'F'
      " 123456789abcdef",   // leading space
      "123456789abcdef ",   // trailing space
      "-123456789abcdef",   // sign
  };
  for (const auto& s : bad) {
    CAPTURE(s);
    CHECK_FALSE(cairn::parse_checksum_hex(s).has_value());
  }
  // An embedded NUL is a character like any other: not a digit, and no early end.
  const std::string nul("01234567\0abcdef0", 16);
  CHECK_FALSE(cairn::parse_checksum_hex(nul).has_value());
  // Only the 16 characters of the view are read.
  const std::string longer = "0123456789abcdefXYZ";
  CHECK(cairn::parse_checksum_hex(std::string_view(longer).substr(0, 16)) == 0x0123456789abcdefull);
}
