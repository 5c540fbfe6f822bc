// pickle: reading CPython's pickles (protocols 2 and 5), writer round trips, malformed input.
#include "cairn/format/torch/pickle.hpp"

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

namespace {
std::string nested_lists(std::size_t depth) {
  return std::string(depth, ']') + std::string(depth - 1, 'a');
}
std::string proto2(std::string body) { return "\x80\x02" + body + "."; }
std::string binput(int i) { return std::string("q") + static_cast<char>(i); }
std::string binget(int i) { return std::string("h") + static_cast<char>(i); }
}  // namespace

TEST_CASE("BUILD on a dict with itself as state (the 14-byte pickle) leaves it unchanged") {
  // d = {1: 2, 3: 4}; DUP; BUILD: iterating d's entries while appending to them was a heap
  // use-after-free once the vector grew.
  std::string p("}(K\x01K\x02K\x03K\x04u2b.", 14);
  pk::value v = pk::load(sv(p), "build.pkl").value();
  REQUIRE(v.is_dict());
  REQUIRE(v.entries->size() == 2);
  CHECK(v.entries->at(0).first.i == 1);
  CHECK(v.entries->at(1).second.i == 4);
  // With another dict as state, its entries are added.
  pk::value w =
      pk::load(sv(proto2("}K\x01K\x02s}K\x03K\x04sb")), "build.pkl").value();  // {1:2} + {3:4}
  REQUIRE(w.entries->size() == 2);
  CHECK(w.entries->at(1).second.i == 4);
}

TEST_CASE("a value that contains itself is a corrupt error at the offset that made it") {
  auto r = pk::load(sv(proto2("]" + binput(0) + binget(0) + "a")), "cyc.pkl");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().file == "cyc.pkl");
  CHECK(r.err().offset == 2u);
  CHECK(r.err().message.find("reference cycle") != std::string::npos);
  // Through an object's state and a dict's values.
  CHECK(!pk::load(sv(proto2("cm\nC\n)\x81" + binput(0) + "}(U\x01x" + binget(0) + "ub")), "o"));
  // A cycle the result does not reach is garbage, torn down without leaking (checked by the
  // sanitizer build), as is the memo of a load that fails half-way.
  pk::value none = pk::load(sv(proto2("]" + binput(0) + binget(0) + "a0N")), "g").value();
  CHECK(none.is_none());
  CHECK(!pk::load(sv("\x80\x02]" + binput(0) + binget(0) + "a\xff"), "bad"));
  // Sharing without a cycle is fine: the same list twice.
  pk::value twice =
      pk::load(sv(proto2("]" + binput(0) + "K\x01" + "a0(" + binget(0) + binget(0) + "t")), "s")
          .value();
  CHECK(twice.elements()[0].items == twice.elements()[1].items);
}

TEST_CASE("nesting deeper than the limit is a resource error, however it is reached") {
  CHECK(pk::load(sv(proto2(nested_lists(256))), "d").has_value());
  auto r = pk::load(sv(proto2(nested_lists(257))), "d");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::resource);
  CHECK(r.err().message.find("deeper than 256") != std::string::npos);
  pk::load_limits shallow;
  shallow.max_depth = 10;
  CHECK(pk::load(sv(proto2(nested_lists(10))), "d", shallow).has_value());
  CHECK(!pk::load(sv(proto2(nested_lists(11))), "d", shallow));
  // A 200-deep chain C, first reached right under the root (depth 201), then again under a
  // 100-deep chain (depth 301).
  std::string chain = nested_lists(200) + binput(0) + "0";
  std::string under = std::string(100, ']') + binget(0) + std::string(100, 'a');
  auto shared = pk::load(sv(proto2(chain + "(" + binget(0) + under + "l")), "dag");
  REQUIRE(!shared);
  CHECK(shared.err().code == cairn::errc::resource);
}

TEST_CASE("a value far larger than its pickle (memo sharing) is a resource error") {
  // L0 = [1, 2, 3, 4]; L(k+1) = [Lk, Lk]: level 30 holds 2^32 ints in 200 bytes.
  std::string p = "(K\x01K\x02K\x03K\x04l" + binput(0) + "0";
  for (int k = 1; k <= 30; ++k) p += "(" + binget(k - 1) + binget(k - 1) + "l" + binput(k) + "0";
  auto r = pk::load(sv(proto2(p + binget(30))), "bomb");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::resource);
  CHECK(r.err().message.find("memo bomb") != std::string::npos);
  // 10 levels (2^12 ints) are well inside the slack for small files.
  CHECK(pk::load(sv(proto2(p + binget(10))), "ok").has_value());
  // Stricter limits refuse it too.
  pk::load_limits tight;
  tight.slack = 0;
  tight.nodes_per_byte = 1;
  CHECK(!pk::load(sv(proto2(p + binget(10))), "tight", tight));
  // Copies of a long string by GET count their bytes.
  std::string s =
      "X" + std::string("\x00\x00\x01\x00", 4) + std::string(1 << 16, 'y') + binput(0) + "0(";
  for (int i = 0; i < 2000; ++i) s += binget(0);
  auto copies = pk::load(sv(proto2(s + "l")), "copies");
  REQUIRE(!copies);
  CHECK(copies.err().code == cairn::errc::resource);
}

TEST_CASE("mutated pickles never throw or crash") {
  auto base = unhex(cairn_samples::basic_p2);
  std::uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int loaded = 0;
  for (int round = 0; round < 3000; ++round) {
    auto b = base;
    for (int k = 0; k < 1 + static_cast<int>(next() % 4); ++k)
      b[next() % b.size()] = static_cast<std::byte>(next() & 0xff);
    if (next() % 4 == 0) b.resize(next() % b.size());
    auto r = pk::load(b, "fuzz.pkl");
    loaded += r.has_value();
    if (!r) CHECK(!r.err().message.empty());
  }
  CHECK(loaded > 0);
}
