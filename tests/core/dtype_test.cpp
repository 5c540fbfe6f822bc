// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include "cairn/core/dtype.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cairn/core/common_value.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"

TEST_CASE("dtype names and sizes follow safetensors") {
  for (cairn::dtype t : cairn::all_dtypes) {
    CHECK(cairn::dtype_from_name(cairn::dtype_name(t)) == t);
    CHECK(cairn::dtype_size(t) >= 1);
  }
  CHECK(cairn::dtype_name(cairn::dtype::bf16) == "BF16");
  CHECK(cairn::dtype_name(cairn::dtype::f8_e4m3) == "F8_E4M3");
  CHECK(cairn::dtype_size(cairn::dtype::f64) == 8);
  CHECK(!cairn::dtype_from_name("F4").has_value());
  static_assert(cairn::dtype_of<float> == cairn::dtype::f32);
  static_assert(cairn::dtype_of<cairn::bf16> == cairn::dtype::bf16);
  static_assert(cairn::dtype_of<bool> == cairn::dtype::bool_);
}

TEST_CASE("f16 and bf16 convert exactly where representable and round to nearest even") {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-08f}) {
    CHECK(float(cairn::f16(f)) == f);
  }
  CHECK(std::isinf(float(cairn::f16(1e6f))));
  CHECK(std::isnan(float(cairn::f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float(cairn::bf16(1.0f)) == 1.0f);
  CHECK(float(cairn::bf16(3.140625f)) == 3.140625f);
  CHECK(cairn::bf16(1.00390625f).bits == cairn::bf16(1.0f).bits);  // tie rounds to even
  CHECK(std::isnan(float(cairn::bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Every f16 bit pattern that is not NaN survives f16 -> float -> f16.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    cairn::f16 h;
    h.bits = static_cast<std::uint16_t>(b);
    float f = float(h);
    if (std::isnan(f)) continue;
    REQUIRE(cairn::f16(f).bits == h.bits);
  }
}
