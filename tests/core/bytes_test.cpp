// tests/core/bytes_test.cpp: cairn/core/bytes.hpp, the owned byte buffer (`cairn::bytes`) that
// codecs produce and communicators exchange: its identity with std::vector<std::byte>, views as
// spans, and a round trip through its own codec (empty, embedded zeros, every byte value).
#include "cairn/core/bytes.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "cairn/core/codec.hpp"

TEST_CASE("bytes is std::vector of std::byte, so encoded values and messages are one type") {
  static_assert(std::is_same_v<cairn::bytes, std::vector<std::byte>>);
  // What codecs return is directly a cairn::bytes, with no conversion.
  static_assert(std::is_same_v<decltype(cairn::codec<int>::encode(0)), cairn::bytes>);
  static_assert(std::is_convertible_v<cairn::bytes&, std::span<const std::byte>>);
  static_assert(std::is_convertible_v<cairn::bytes&, std::span<std::byte>>);

  cairn::bytes b{std::byte{1}, std::byte{0}, std::byte{255}};
  std::span<const std::byte> view = b;
  CHECK(view.size() == 3);
  CHECK(view.data() == b.data());  // a view, not a copy
  cairn::bytes copy = b;
  copy[1] = std::byte{7};
  CHECK(b[1] == std::byte{0});  // copies own their bytes
  CHECK(copy != b);
}

TEST_CASE("bytes round-trips through its codec: empty, zeros and every byte value") {
  cairn::bytes all(256);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::byte>(i);
  for (const cairn::bytes& in : {cairn::bytes{}, cairn::bytes(5, std::byte{0}), all}) {
    cairn::bytes enc = cairn::codec<cairn::bytes>::encode(in);
    CHECK(enc == in);
    cairn::bytes out{std::byte{9}, std::byte{9}};  // previous contents are replaced
    REQUIRE(cairn::codec<cairn::bytes>::decode(enc, out).has_value());
    CHECK(out == in);
  }
  static_assert(cairn::encodable<cairn::bytes>);
}
