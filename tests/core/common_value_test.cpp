// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include "cairn/core/common_value.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

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
