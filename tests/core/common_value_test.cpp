// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include "cairn/core/common_value.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "cairn/core/dtype.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"

TEST_CASE("common values keep kind and dtype and never convert silently") {
  auto v = cairn::common_value::of(std::int64_t{42});
  CHECK(v.describe_type() == "I64 scalar");
  CHECK(v.as<std::int64_t>() == 42);
  std::int32_t narrow = 0;
  auto r = v.get(narrow);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::mismatch);
  auto s = cairn::common_value::of(std::string("adamw"));
  CHECK(s.as<std::string>() == "adamw");
  auto vec = cairn::common_value::of(std::vector<double>{1.5, 2.5});
  CHECK(vec.as<std::vector<double>>() == std::vector<double>{1.5, 2.5});
  enum class mode : std::uint8_t { a = 3 };
  CHECK(cairn::common_value::of(mode::a).as<mode>() == mode::a);
}

TEST_CASE("common_value::str shows values short, as messages and cairn inspect print them") {
  using cv = cairn::common_value;
  CHECK(cv::of(std::int64_t{1000}).str() == "1000");
  CHECK(cv::of(0.9).str() == "0.9");                     // not 0.90000000000000002
  CHECK(cv::of(0.1f).str() == "0.1");                    // the float's shortest form
  CHECK(cv::of(1.0 / 3).str() == "0.3333333333333333");  // what it takes to read back
  CHECK(cv::of(true).str() == "true");
  CHECK(cv::of(std::string("adamw")).str() == "\"adamw\"");
  CHECK(cv::of(std::string("a\"b\n")).str() == "\"a\\\"b\\x0a\"");
  CHECK(cv::of(std::vector<std::int32_t>{1, 2, 3}).str() == "[1, 2, 3]");
  std::vector<std::int64_t> many(4096);
  std::iota(many.begin(), many.end(), 0);
  const std::string m = cv::of(many).str(20);
  CHECK(m.starts_with("[0, 1, 2, "));
  CHECK(m.ends_with(", ... (4096 elements)]"));
  CHECK(m.size() < 60);
  const std::string s = cv::of(std::string(9000, 'x')).str(10);
  CHECK(s.ends_with("...\" (9000 bytes)"));
}
