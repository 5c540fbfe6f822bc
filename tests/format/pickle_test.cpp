// pickle: reading CPython's pickles (protocols 2 and 5), writer round trips, malformed input.
#include "cairn/format/pickle.hpp"

#include <doctest/doctest.h>

#include "tests/format/samples/pickles.hpp"

namespace pk = cairn::pickle;
using kind = pk::value::kind;

namespace {
std::vector<std::byte> unhex(std::string_view h) {
  std::vector<std::byte> out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<std::byte>(nib(h[i]) * 16 + nib(h[i + 1])));
  return out;
}
std::span<const std::byte> sv(const std::string& s) { return cairn::format_detail::as_bytes(s); }
}  // namespace

TEST_CASE("reads CPython pickles of protocol 2 and 5 into a value tree") {
  for (const char* hex : {cairn_samples::basic_p2, cairn_samples::basic_p5}) {
    auto bytes = unhex(hex);
    pk::value v = pk::load(bytes, "basic.pkl").value();
    REQUIRE(v.is_dict());
    const auto& a = v.get("a")->elements();
    REQUIRE(a.size() == 6);
    CHECK(a[0].i == 1);
    CHECK(a[1].i == -2);
    CHECK(a[2].i == 300);
    CHECK(a[3].i == 70000);
    CHECK(a[4].i == -(std::int64_t{1} << 40));
    CHECK(a[5].type == kind::big_integer);
    const auto& b = v.get("b")->elements();
    REQUIRE(v.get("b")->type == kind::tuple);
    CHECK(b[0].f == 1.5);
    CHECK(b[1].is_none());
    CHECK((b[2].type == kind::boolean && b[2].i == 1));
    CHECK(b[3].i == 0);
    const pk::value& c = *v.get("c");
    if (c.type == kind::bytes) {
      CHECK(c.str == std::string("\0\xff", 2));
    } else {  // protocol 2: _codecs.encode('\x00\xff', 'latin1')
      REQUIRE(c.is_object());
      CHECK(c.obj->is("_codecs", "encode"));
      CHECK(c.obj->args.elements()[0].str == std::string("\0\xc3\xbf", 3));
    }
    CHECK(v.get("d")->get("x")->str == "\xc3\xa9\n");
    CHECK(v.get("t")->elements().empty());
    CHECK(v.get("t4")->elements().size() == 4);
    const pk::value& g = *v.get("g");
    REQUIRE(g.is_object());
    CHECK(g.obj->is("collections", "OrderedDict"));
    // Memoized shared list: the same node both times.
    CHECK(v.get("s1")->items == v.get("s2")->items);
  }
}

TEST_CASE("writer output reads back identically, every protocol") {
  pk::value tree = pk::value::dict({
      {pk::value::string("ints"),
       pk::value::list({pk::value::integer(0), pk::value::integer(255), pk::value::integer(256),
                        pk::value::integer(65536), pk::value::integer(-1),
                        pk::value::integer(INT64_MIN), pk::value::integer(INT64_MAX),
                        pk::value::integer(std::int64_t{1} << 31)})},
      {pk::value::string("f"), pk::value::floating(-0.25)},
      {pk::value::string("b"), pk::value::bytes(std::string("\x01\x80", 2))},
      {pk::value::string("t"),
       pk::value::tuple({pk::value::none(), pk::value::boolean(true), pk::value::tuple(),
                         pk::value::string(std::string(300, 'x'))})},
      {pk::value::string("o"),
       pk::value::instance("torch", "Size", pk::value::tuple({pk::value::tuple()}), pk::value(),
                           false)},
      {pk::value::string("p"),
       pk::value::persistent(pk::value::tuple({pk::value::string("storage")}))},
      {pk::value::string("s"), pk::value::sequence(kind::set, {pk::value::integer(3)})},
  });
  for (int proto : {2, 3, 4, 5}) {
    std::string bytes = pk::dumps(tree, proto);
    pk::value back = pk::load(sv(bytes)).value();
    CHECK(pk::dumps(back, proto) == bytes);
    const auto& ints = back.get("ints")->elements();
    CHECK(ints[5].i == INT64_MIN);
    CHECK(ints[6].i == INT64_MAX);
    CHECK(ints[7].i == (std::int64_t{1} << 31));
    CHECK(back.get("f")->f == -0.25);
    if (proto >= 3) CHECK(back.get("b")->str == std::string("\x01\x80", 2));
    CHECK(back.get("t")->elements()[3].str.size() == 300);
    CHECK(back.get("o")->obj->is("torch", "Size"));
    CHECK(back.get("p")->type == kind::persistent_id);
  }
}

TEST_CASE("malformed pickles are corrupt errors with the opcode offset") {
  auto bad = [](std::string bytes, std::uint64_t offset, std::string fragment) {
    auto r = pk::load(sv(bytes), "data.pkl");
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::corrupt);
    CHECK(r.err().file == "data.pkl");
    CHECK(r.err().offset == offset);
    CHECK_MESSAGE(r.err().message.find(fragment) != std::string::npos, r.err().describe());
  };
  bad("\x80\x02K", 2, "truncated");
  bad("\x80\x02K\x01", 4, "no STOP");
  bad("\x80\x02h\x05.", 2, "memo");
  bad("\x80\x02\xff.", 2, "opcode 0xff");
  bad("\x80\x02K\x01K\x02.", 6, "STOP");
  bad("\x80\x02t.", 2, "MARK");
  bad(std::string("\x80\x02X\xff\x00\x00\x00"
                  "ab",
                  9),
      2, "truncated");
  bad("\x80\x09.", 0, "protocol");
}
