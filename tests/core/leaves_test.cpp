// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
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

TEST_CASE("from_rank_offsets computes global shape, offset and fragmentation") {
  std::vector<float> buf(4 * 3);
  auto t = cairn::from_rank_offsets("w", std::span(buf), {4, 3}, {{0, 1, 2}, {1, 2, 4}});
  CHECK(t.global_shape == cairn::shape{8, 12});
  CHECK(t.global_offset == cairn::shape{4, 6});
  CHECK(t.axis_fragmentations == cairn::shape{2, 4});
  CHECK(t.type == cairn::dtype::f32);
  CHECK(cairn::validate_sharding(t, buf.size()));
  // prepended axis: one layer of a stack of 5
  auto p = cairn::from_rank_offsets("layers.w", std::span(buf), {4, 3}, {{0, 3, 5}}, 0, 1);
  CHECK(p.global_shape == cairn::shape{5, 4, 3});
  CHECK(p.global_offset == cairn::shape{3, 0, 0});
  CHECK(cairn::validate_sharding(p, buf.size()));
  CHECK_THROWS_AS(cairn::from_rank_offsets("w", std::span(buf), {4, 3}, {{2, 0, 2}}),
                  cairn::exception);
  auto r = cairn::replicated("b", std::span(buf), {12}, 1);
  CHECK(r.replica_id == 1);
  CHECK(r.global_offset == cairn::shape{0});
}

TEST_CASE("validate_sharding names the key and the problem") {
  std::vector<float> buf(6);
  auto t = cairn::block("w", std::span(buf), {2, 3}, {4, 3}, {3, 0});
  auto r = cairn::validate_sharding(t, buf.size());
  REQUIRE(!r);
  CHECK(r.err().key == "w");
  CHECK(r.err().message.find("exceeds global size") != std::string::npos);
  auto ok = cairn::block("w", std::span(buf), {2, 3}, {4, 3}, {2, 0});
  CHECK(cairn::validate_sharding(ok, buf.size()));
  CHECK(!cairn::validate_sharding(ok, 5));
  ok.flattened_range = cairn::flat_range{1, 4};
  CHECK(cairn::validate_sharding(ok, 3));
  ok.flattened_range = cairn::flat_range{4, 9};
  CHECK(!cairn::validate_sharding(ok, 5));
}

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

TEST_CASE("object codecs and unique keys") {
  struct pod {
    int a;
    double b;
  };
  auto enc = cairn::codec<pod>::encode(pod{1, 2.0});
  pod back{};
  CHECK(cairn::codec<pod>::decode(enc, back));
  CHECK(back.b == 2.0);
  CHECK(!cairn::codec<pod>::decode(std::span(enc).first(3), back));
  CHECK(cairn::object_unique_key("rng", {1, 2}, {4, 8}) == "rng/shard_1.2_4.8");
}
