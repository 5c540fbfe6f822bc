// tests/core/error_test.cpp: cairn/core/error.hpp: errc names, error::describe() with and
// without context, the fluent setters (outer layers never overwrite what inner ones set),
// cairn::exception, result<T> and result<void> (throwing accessors, moving out of temporaries),
// CAIRN_TRY / CAIRN_TRY_ASSIGN, and detail::catch_all's mapping of foreign exceptions.
#include "cairn/core/error.hpp"

#include <doctest/doctest.h>

#include <iterator>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace error_test {

inline cairn::result<int> parse_digit(char c) {
  if (c < '0' || c > '9')
    return cairn::make_error(cairn::errc::invalid_argument, std::string("not a digit: ") + c);
  return c - '0';
}

/// Sums two digits with CAIRN_TRY_ASSIGN (twice in one function) and counts evaluations.
inline cairn::result<int> sum_digits(const char* s, int& evaluations) {
  CAIRN_TRY_ASSIGN(int a, (++evaluations, parse_digit(s[0])));
  CAIRN_TRY_ASSIGN(const int b, (++evaluations, parse_digit(s[1])));
  return a + b;
}

/// CAIRN_TRY on a result<void> and on a result<int>, inside a function returning result<void>.
inline cairn::result<void> check_digits(const char* s, int& evaluations) {
  CAIRN_TRY((++evaluations, parse_digit(s[0])));
  CAIRN_TRY((++evaluations,
             s[1] == '!' ? cairn::result<void>(cairn::make_error(cairn::errc::corrupt, "bang"))
                         : cairn::ok()));
  return cairn::ok();
}

}  // namespace error_test

TEST_CASE("every errc has its own lower-case name") {
  static_assert(std::string_view(cairn::errc_name(cairn::errc::corrupt)) == "corrupt");
  const cairn::errc all[] = {cairn::errc::io,
                             cairn::errc::corrupt,
                             cairn::errc::incomplete_checkpoint,
                             cairn::errc::invalid_argument,
                             cairn::errc::mismatch,
                             cairn::errc::not_found,
                             cairn::errc::already_exists,
                             cairn::errc::integrity,
                             cairn::errc::unsupported_version,
                             cairn::errc::comm,
                             cairn::errc::resource};
  std::set<std::string> names;
  for (auto c : all) {
    std::string n = cairn::errc_name(c);
    CHECK(n != "unknown");
    CHECK(!n.empty());
    for (char ch : n) CHECK((ch == ' ' || (ch >= 'a' && ch <= 'z')));
    names.insert(n);
  }
  CHECK(names.size() == std::size(all));
  CHECK(std::string(cairn::errc_name(cairn::errc::incomplete_checkpoint)) ==
        "incomplete checkpoint");
  CHECK(std::string(cairn::errc_name(cairn::errc::unsupported_version)) == "unsupported version");
  CHECK(std::string(cairn::errc_name(static_cast<cairn::errc>(999))) == "unknown");
}

TEST_CASE("describe names the code, the message and every known piece of context") {
  auto e = cairn::make_error(cairn::errc::corrupt, "checksum mismatch");
  CHECK(e.rank == -1);
  CHECK_FALSE(e.offset.has_value());
  CHECK(e.describe() == "corrupt: checksum mismatch");

  e.key = "w";
  e.rank = 1;
  e.file = "/ckpt/__1_0.distcp";
  e.offset = 4096;
  CHECK(e.describe() ==
        "corrupt: checksum mismatch [key=w rank=1 file=/ckpt/__1_0.distcp "
        "offset=4096]");

  SUBCASE("rank 0 and offset 0 are known values, not absent ones") {
    auto z = cairn::make_error(cairn::errc::io, "short read");
    z.rank = 0;
    z.offset = 0;
    CHECK(z.describe() == "io: short read [rank=0 offset=0]");
  }
  SUBCASE("only the fields that are set appear, in a fixed order") {
    auto f = cairn::make_error(cairn::errc::not_found, "missing");
    f.file = "a.json";
    CHECK(f.describe() == "not found: missing [file=a.json]");
    f.offset = 18446744073709551615ull;
    CHECK(f.describe() == "not found: missing [file=a.json offset=18446744073709551615]");
  }
}

TEST_CASE("with_key, with_rank and with_file fill empty fields and never overwrite") {
  auto e = cairn::make_error(cairn::errc::io, "write failed")
               .with_key("inner.key")
               .with_rank(2)
               .with_file("inner.bin");
  CHECK(e.key == "inner.key");
  CHECK(e.rank == 2);
  CHECK(e.file == "inner.bin");
  // An outer layer adds its context: what the inner layer knew wins.
  e = std::move(e).with_key("outer.key").with_rank(5).with_file("outer.bin");
  CHECK(e.key == "inner.key");
  CHECK(e.rank == 2);
  CHECK(e.file == "inner.bin");
  CHECK(e.message == "write failed");  // self-assignment through the chain keeps the message

  auto r0 = cairn::make_error(cairn::errc::io, "x").with_rank(0).with_rank(3);
  CHECK(r0.rank == 0);  // rank 0 counts as set
  auto empty_key = cairn::make_error(cairn::errc::io, "x").with_key("").with_key("k");
  CHECK(empty_key.key == "k");
}

TEST_CASE("cairn::exception carries the structured error and describes it in what()") {
  auto e = cairn::make_error(cairn::errc::mismatch, "dtype differs").with_key("w").with_rank(1);
  try {
    throw cairn::exception(e);
  } catch (const std::runtime_error& x) {  // catchable as a standard exception
    CHECK(std::string(x.what()) == "mismatch: dtype differs [key=w rank=1]");
    auto* ce = dynamic_cast<const cairn::exception*>(&x);
    REQUIRE(ce != nullptr);
    CHECK(ce->err().code == cairn::errc::mismatch);
    CHECK(ce->err().key == "w");
    CHECK(ce->err().rank == 1);
  }
}

TEST_CASE("result holds a value or an error, and its accessors throw the error") {
  cairn::result<std::string> good = std::string("abc");
  CHECK(good.has_value());
  CHECK(static_cast<bool>(good));
  CHECK(*good == "abc");
  CHECK(good->size() == 3);
  good.value() += "d";
  CHECK(good.value() == "abcd");

  cairn::result<std::string> bad =
      cairn::make_error(cairn::errc::not_found, "no key").with_key("k");
  CHECK_FALSE(bad.has_value());
  CHECK_FALSE(static_cast<bool>(bad));
  CHECK(bad.err().code == cairn::errc::not_found);
  try {
    (void)bad.value();
    FAIL_CHECK("value() did not throw");
  } catch (const cairn::exception& x) {
    CHECK(x.err().key == "k");
    CHECK(std::string(x.what()) == "not found: no key [key=k]");
  }
  CHECK_THROWS_AS((void)*bad, cairn::exception);
  CHECK_THROWS_AS((void)bad->size(), cairn::exception);
  const auto& cbad = bad;
  CHECK_THROWS_AS((void)cbad.value(), cairn::exception);
  CHECK_THROWS_AS((void)std::move(bad).value(), cairn::exception);

  // A moved-out error keeps its fields.
  cairn::error moved = cairn::result<int>(cairn::make_error(cairn::errc::io, "m")).err();
  CHECK(moved.message == "m");
}

TEST_CASE("a temporary result gives its value away: move-only values, no dangling loops") {
  auto make = [] { return cairn::result<std::unique_ptr<int>>(std::make_unique<int>(7)); };
  std::unique_ptr<int> p = make().value();
  REQUIRE(p);
  CHECK(*p == 7);
  std::unique_ptr<int> q = *make();
  CHECK(*q == 7);

  auto words = [] {
    return cairn::result<std::vector<std::string>>(
        std::vector<std::string>{"a long string that does not fit in SSO", "b"});
  };
  std::string joined;
  for (auto& w : words().value()) joined += w;  // the vector lives for the whole loop
  CHECK(joined == "a long string that does not fit in SSOb");
}

TEST_CASE("result<void> is success or an error") {
  cairn::result<void> fine = cairn::ok();
  CHECK(fine.has_value());
  CHECK_NOTHROW(fine.value());
  cairn::result<void> failed = cairn::make_error(cairn::errc::integrity, "overlap");
  CHECK_FALSE(failed);
  CHECK(failed.err().message == "overlap");
  CHECK_THROWS_WITH_AS(failed.value(), "integrity: overlap", cairn::exception);
  cairn::error taken = std::move(failed).err();
  CHECK(taken.code == cairn::errc::integrity);
}

TEST_CASE("CAIRN_TRY and CAIRN_TRY_ASSIGN return the first error and evaluate once") {
  int n = 0;
  auto s = error_test::sum_digits("34", n);
  REQUIRE(s.has_value());
  CHECK(*s == 7);
  CHECK(n == 2);

  n = 0;
  auto bad = error_test::sum_digits("x4", n);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message == "not a digit: x");
  CHECK(n == 1);  // stopped at the first error

  n = 0;
  CHECK(error_test::check_digits("12", n).has_value());
  CHECK(n == 2);
  n = 0;
  auto c = error_test::check_digits("1!", n);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.err().code == cairn::errc::corrupt);
  n = 0;
  CHECK(error_test::check_digits("?!", n).err().code == cairn::errc::invalid_argument);
  CHECK(n == 1);
}

TEST_CASE("catch_all turns whatever is thrown into an error") {
  using cairn::detail::catch_all;
  static_assert(noexcept(catch_all("x", [] { return cairn::ok(); })));
  auto run = [](auto thrower) {
    return catch_all("writing shard", [&]() -> cairn::result<int> {
      thrower();
      return 1;
    });
  };
  CHECK(*run([] {}) == 1);

  auto ce = run([] {
    throw cairn::exception(cairn::make_error(cairn::errc::corrupt, "bad magic").with_file("f"));
  });
  CHECK(ce.err().code == cairn::errc::corrupt);
  CHECK(ce.err().message == "bad magic");  // unchanged, context kept
  CHECK(ce.err().file == "f");

  auto oom = run([] { throw std::bad_alloc(); });
  CHECK(oom.err().code == cairn::errc::resource);
  CHECK(oom.err().message == "out of memory while writing shard");

  auto std_ex = run([] { throw std::out_of_range("index 9"); });
  CHECK(std_ex.err().code == cairn::errc::io);
  CHECK(std_ex.err().message == "writing shard failed: index 9");

  auto other = run([] { throw 42; });
  CHECK(other.err().code == cairn::errc::io);
  CHECK(other.err().message == "writing shard failed: unknown exception");

  auto v = catch_all("syncing", []() -> cairn::result<void> { throw std::runtime_error("EIO"); });
  CHECK(v.err().message == "syncing failed: EIO");
}
