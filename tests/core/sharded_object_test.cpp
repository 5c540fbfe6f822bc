// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include "cairn/core/sharded_object.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/sharded_tensor.hpp"

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
