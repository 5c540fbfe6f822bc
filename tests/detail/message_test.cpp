// tests/detail/message_test.cpp: cairn/detail/message.hpp, the codec of every message between
// ranks: each kind of field round-trips, nested structs and containers, a type with its own
// message_traits; and what a hostile or broken peer sends (truncated input, a lying count that
// would allocate terabytes, a flag or variant index out of range, bytes left over) is an
// errc::comm error naming the message and the byte offset, never a throw.
#include "cairn/detail/message.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/core/error.hpp"
#include "tests/support/message_check.hpp"

namespace message_test {

using cairn::bytes;
using cairn::detail::decode_message;
using cairn::detail::encode_message;

enum class colour : std::uint8_t { red = 1, blue = 7 };

struct inner {
  std::string name;
  std::vector<std::int64_t> shape;
  bool flag = false;
};

struct every_kind {
  static constexpr std::string_view message_name = "test message";
  bool yes = false;
  std::uint8_t u8 = 0;
  std::int32_t i32 = 0;
  std::uint64_t u64 = 0;
  double real = 0;
  colour c = colour::red;
  std::byte b{};
  std::string text;
  bytes blob;
  std::vector<inner> inners;
  std::optional<std::string> maybe;
  std::optional<inner> nothing;
  std::pair<int, std::string> pair;
  std::array<std::uint16_t, 3> fixed{};
  std::map<std::string, std::uint64_t> counts;
  std::variant<std::monostate, std::int64_t, std::string> either;
  std::optional<cairn::error> status;
  std::vector<std::vector<std::string>> nested;
};

every_kind sample() {
  every_kind m;
  m.yes = true;
  m.u8 = 200;
  m.i32 = -7;
  m.u64 = std::numeric_limits<std::uint64_t>::max();
  m.real = 0.1;
  m.c = colour::blue;
  m.b = std::byte{0xab};
  m.text = "model.layers.0.weight";
  m.blob = {std::byte{1}, std::byte{0}, std::byte{255}};
  m.inners = {{"a", {1, 2, 3}, true}, {"", {}, false}};
  m.maybe = "here";
  m.pair = {-3, "three"};
  m.fixed = {1, 2, 65535};
  m.counts = {{"x", 1}, {"y", 2}};
  m.either = std::string("alternative 2");
  m.status = cairn::make_error(cairn::errc::corrupt, "bad bytes").with_key("k").with_rank(3);
  m.status->file = "__0_0.distcp";
  m.status->offset = 4096;
  m.nested = {{"a", "b"}, {}, {"c"}};
  return m;
}

TEST_CASE("every kind of field survives the round trip") {
  const every_kind m = sample();
  const bytes b = encode_message(m);
  auto back = decode_message<every_kind>(b);
  REQUIRE(back.has_value());
  CHECK(back->yes);
  CHECK(back->u8 == 200);
  CHECK(back->i32 == -7);
  CHECK(back->u64 == m.u64);
  CHECK(back->real == 0.1);
  CHECK(back->c == colour::blue);
  CHECK(back->b == std::byte{0xab});
  CHECK(back->text == m.text);
  CHECK(back->blob == m.blob);
  REQUIRE(back->inners.size() == 2);
  CHECK(back->inners[0].name == "a");
  CHECK(back->inners[0].shape == std::vector<std::int64_t>{1, 2, 3});
  CHECK(back->inners[0].flag);
  CHECK(back->maybe == "here");
  CHECK_FALSE(back->nothing.has_value());
  CHECK(back->pair == m.pair);
  CHECK(back->fixed == m.fixed);
  CHECK(back->counts == m.counts);
  CHECK(std::get<2>(back->either) == "alternative 2");
  REQUIRE(back->status.has_value());
  CHECK(back->status->code == cairn::errc::corrupt);
  CHECK(back->status->message == "bad bytes");
  CHECK(back->status->key == "k");
  CHECK(back->status->rank == 3);
  CHECK(back->status->file == "__0_0.distcp");
  CHECK(back->status->offset == 4096u);
  CHECK(back->nested == m.nested);
}

TEST_CASE("every prefix of a message and a padded message are refused") {
  cairn_test::check_message(sample());
  cairn_test::check_message(inner{"x", {5}, true});
  cairn_test::check_message(std::vector<bytes>{{std::byte{1}}, {}, {std::byte{2}, std::byte{3}}});
}

TEST_CASE("a malformed message names itself and the byte offset") {
  bytes b = encode_message(sample());
  b.resize(b.size() - 1);
  auto r = decode_message<every_kind>(b);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().code == cairn::errc::comm);
  CHECK(r.err().message.find("malformed test message between ranks") != std::string::npos);
  CHECK(r.err().message.find("of " + std::to_string(b.size())) != std::string::npos);
  auto named = decode_message<inner>(b, "leaf description");
  REQUIRE_FALSE(named.has_value());
  CHECK(named.err().message.find("malformed leaf description") != std::string::npos);
}

TEST_CASE("a lying count is refused before anything is allocated") {
  // A vector of strings that claims 2^62 elements: each takes at least 8 bytes, and 16 are left.
  cairn::detail::message_writer w;
  w.count(std::size_t{1} << 62);
  w.count(0);
  w.count(0);
  auto r = decode_message<std::vector<std::string>>(w.data());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().message.find("does not fit") != std::string::npos);
  CHECK(r.err().message.find("at byte 0 ") != std::string::npos);
  // A string that claims more bytes than are left.
  cairn::detail::message_writer s;
  s.count(100);
  s.raw("abc", 3);
  CHECK_FALSE(decode_message<std::string>(s.data()).has_value());
}

TEST_CASE("flags and variant indexes out of range are refused") {
  bytes flag = encode_message(std::optional<std::int64_t>(5));
  flag[0] = std::byte{2};
  auto f = decode_message<std::optional<std::int64_t>>(flag);
  REQUIRE_FALSE(f.has_value());
  CHECK(f.err().message.find("a flag is 2, not 0 or 1 at byte 0 of 9") != std::string::npos);
  bytes b = encode_message(true);
  b[0] = std::byte{9};
  CHECK_FALSE(decode_message<bool>(b).has_value());
  using either = std::variant<std::int64_t, std::string>;
  bytes v = encode_message(either{std::int64_t{1}});
  v[0] = std::byte{2};
  auto e = decode_message<either>(v);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.err().message.find("index is 2 of 2") != std::string::npos);
}

TEST_CASE("a map whose keys are out of order or repeated is refused") {
  using counts = std::map<std::string, std::uint64_t>;
  cairn::detail::message_writer w;
  w.count(2);
  cairn::detail::write_message(w, std::pair<std::string, std::uint64_t>("b", 1));
  cairn::detail::write_message(w, std::pair<std::string, std::uint64_t>("a", 2));
  auto r = decode_message<counts>(w.data());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().message.find("out of order or repeated at byte 25") != std::string::npos);
  cairn::detail::message_writer twice;
  twice.count(2);
  cairn::detail::write_message(twice, std::pair<std::string, std::uint64_t>("a", 1));
  cairn::detail::write_message(twice, std::pair<std::string, std::uint64_t>("a", 2));
  CHECK_FALSE(decode_message<counts>(twice.data()).has_value());
}

TEST_CASE("empty input is a truncated message, never a default value") {
  CHECK_FALSE(decode_message<std::uint64_t>({}).has_value());
  CHECK_FALSE(decode_message<inner>({}).has_value());
  // An empty struct's encoding is empty: that, and only that, decodes.
  struct nothing {};
  CHECK(encode_message(nothing{}).empty());
  CHECK(decode_message<nothing>({}).has_value());
}

/// A non-aggregate with its own encoding: a value kept as text, sent as a number.
class port {
 public:
  port() = default;
  explicit port(std::uint16_t p) : p_(p) {}
  std::uint16_t get() const { return p_; }

 private:
  std::uint16_t p_ = 0;
};

}  // namespace message_test

template <>
struct cairn::detail::message_traits<message_test::port> {
  static constexpr std::size_t min_size = 2;
  static void write(message_writer& w, const message_test::port& p) {
    const std::uint16_t v = p.get();
    w.raw(&v, 2);
  }
  static bool read(message_reader& r, message_test::port& p) {
    std::uint16_t v = 0;
    const std::size_t at = r.position();
    if (!r.raw(&v, 2)) return false;
    if (v == 0) return r.fail("port 0", at);
    p = message_test::port(v);
    return true;
  }
};

namespace message_test {

TEST_CASE("a type with message_traits is encoded its own way") {
  const std::vector<port> ports{port(80), port(443)};
  const bytes b = encode_message(ports);
  CHECK(b.size() == 8 + 4);
  auto back = decode_message<std::vector<port>>(b);
  REQUIRE(back.has_value());
  CHECK((*back)[1].get() == 443);
  bytes zero = encode_message(std::vector<port>{port(0)});
  auto bad = decode_message<std::vector<port>>(zero);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("port 0 at byte 8") != std::string::npos);
}

}  // namespace message_test
