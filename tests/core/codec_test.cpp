// tests/core/codec_test.cpp: cairn/core/codec.hpp: the codecs for trivially copyable types,
// std::string and vectors of trivially copyable types (round trips, byte layout, refusal of
// stored bytes of the wrong size, with both sizes in the message), the `encodable` concept,
// and a user specialization as the header documents it.
#include "cairn/core/codec.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace codec_test {

struct pod {
  std::uint32_t a;
  double b;
  std::array<std::int16_t, 3> c;
};

struct rgb {  // sizeof 3: vectors of it are a whole number of 3-byte elements
  std::uint8_t r, g, b;
};

/// A type that is not trivially copyable and has its own codec, as in the header's example:
/// a counter stored as text.
struct counter {
  std::unique_ptr<int> n;
};

struct no_codec {  // not trivially copyable, no specialization
  std::string s;
  std::vector<int> v;
};

}  // namespace codec_test

template <>
struct cairn::codec<codec_test::counter> {
  static std::vector<std::byte> encode(const codec_test::counter& c) {
    return cairn::codec<std::string>::encode(std::to_string(*c.n));
  }
  static cairn::result<void> decode(std::span<const std::byte> in, codec_test::counter& out) {
    std::string s(reinterpret_cast<const char*>(in.data()), in.size());
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
      return cairn::make_error(cairn::errc::corrupt, "counter is not a number: '" + s + "'");
    out.n = std::make_unique<int>(std::stoi(s));
    return cairn::ok();
  }
};

TEST_CASE("encodable: trivially copyable types, strings, vectors of them, and specializations") {
  static_assert(cairn::encodable<int>);
  static_assert(cairn::encodable<codec_test::pod>);
  static_assert(cairn::encodable<std::string>);
  static_assert(cairn::encodable<std::vector<float>>);
  static_assert(cairn::encodable<std::vector<codec_test::rgb>>);
  static_assert(cairn::encodable<codec_test::counter>);
  static_assert(!cairn::encodable<codec_test::no_codec>);
  static_assert(!cairn::encodable<std::vector<std::string>>);
  static_assert(!cairn::encodable<std::map<int, int>>);
  static_assert(!cairn::encodable<std::unique_ptr<int>>);
}

TEST_CASE("a trivially copyable value is its object representation") {
  codec_test::pod v{};
  std::memset(&v, 0, sizeof v);  // padding included, so the bytes compare
  v.a = 0xdeadbeef;
  v.b = -2.5;
  v.c = {1, -2, 3};
  auto enc = cairn::codec<codec_test::pod>::encode(v);
  REQUIRE(enc.size() == sizeof(codec_test::pod));
  CHECK(std::memcmp(enc.data(), &v, sizeof v) == 0);
  codec_test::pod out{};
  REQUIRE(cairn::codec<codec_test::pod>::decode(enc, out).has_value());
  CHECK(out.a == 0xdeadbeef);
  CHECK(out.b == -2.5);
  CHECK(out.c == std::array<std::int16_t, 3>{1, -2, 3});
}

TEST_CASE("a stored value of the wrong size is a mismatch naming both sizes") {
  const std::int64_t keep = 77;
  std::int64_t out = keep;
  for (std::size_t n : {0u, 4u, 7u, 9u, 16u}) {
    CAPTURE(n);
    std::vector<std::byte> in(n, std::byte{0xff});
    auto r = cairn::codec<std::int64_t>::decode(in, out);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == cairn::errc::mismatch);
    CHECK(r.err().message ==
          "stored value has " + std::to_string(n) + " bytes, the target type has 8");
    CHECK(out == keep);  // untouched on error
  }
}

TEST_CASE("strings keep every byte: empty, embedded NUL, not UTF-8") {
  const std::string cases[] = {std::string(), std::string("a\0b", 3), std::string("\xff\xfe\x80"),
                               std::string(10000, 'z')};
  for (const auto& s : cases) {
    auto enc = cairn::codec<std::string>::encode(s);
    CHECK(enc.size() == s.size());
    std::string out = "previous contents";
    REQUIRE(cairn::codec<std::string>::decode(enc, out).has_value());
    CHECK(out == s);
  }
}

TEST_CASE("vectors are their elements back to back, and refuse a partial element") {
  SUBCASE("round trip") {
    const std::vector<double> v{1.5, -0.0, 1e300};
    auto enc = cairn::codec<std::vector<double>>::encode(v);
    CHECK(enc.size() == 24);
    std::vector<double> out{9, 9, 9, 9, 9};
    REQUIRE(cairn::codec<std::vector<double>>::decode(enc, out).has_value());
    CHECK(out == v);
  }
  SUBCASE("empty input gives an empty vector") {
    CHECK(cairn::codec<std::vector<int>>::encode({}).empty());
    std::vector<int> out{1, 2, 3};
    REQUIRE(cairn::codec<std::vector<int>>::decode({}, out).has_value());
    CHECK(out.empty());
  }
  SUBCASE("odd element sizes") {
    const std::vector<codec_test::rgb> v{{1, 2, 3}, {4, 5, 6}};
    auto enc = cairn::codec<std::vector<codec_test::rgb>>::encode(v);
    REQUIRE(enc.size() == 6);
    std::vector<codec_test::rgb> out;
    REQUIRE(cairn::codec<std::vector<codec_test::rgb>>::decode(enc, out).has_value());
    REQUIRE(out.size() == 2);
    CHECK(out[1].b == 6);
  }
  SUBCASE("a size that is not a whole number of elements") {
    std::vector<std::uint32_t> out{42};
    std::vector<std::byte> in(7);
    auto r = cairn::codec<std::vector<std::uint32_t>>::decode(in, out);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == cairn::errc::mismatch);
    CHECK(r.err().message == "stored vector of 7 bytes is not a whole number of 4-byte elements");
    CHECK(out == std::vector<std::uint32_t>{42});
    std::vector<codec_test::rgb> rgbs;
    CHECK_FALSE(cairn::codec<std::vector<codec_test::rgb>>::decode(in, rgbs).has_value());
  }
}

TEST_CASE("a user specialization is used as written, errors included") {
  codec_test::counter c{std::make_unique<int>(1234)};
  auto enc = cairn::codec<codec_test::counter>::encode(c);
  CHECK(std::string(reinterpret_cast<const char*>(enc.data()), enc.size()) == "1234");
  codec_test::counter back;
  REQUIRE(cairn::codec<codec_test::counter>::decode(enc, back).has_value());
  CHECK(*back.n == 1234);
  const char bad[] = {'1', 'x'};
  auto r = cairn::codec<codec_test::counter>::decode(std::as_bytes(std::span(bad)), back);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(*back.n == 1234);
}
