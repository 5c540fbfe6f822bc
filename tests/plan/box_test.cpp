// Boxes, flattened-range decomposition and row-run iteration.
#include "cairn/plan/box.hpp"

#include <doctest/doctest.h>

#include <random>

TEST_CASE("intersect") {
  cairn::box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  auto x = cairn::intersect(a, b);
  REQUIRE(x);
  CHECK(*x == cairn::box{{2, 3}, {2, 1}});
  CHECK(!cairn::intersect(a, cairn::box{{4, 0}, {1, 1}}));
  CHECK(x->str() == "[2:4, 3:4]");
}

TEST_CASE("a flattened range splits into contiguous boxes that cover exactly the range") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    cairn::tensor_sharding t;
    int nd = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < nd; ++d) t.local_shape.push_back(1 + rng() % 5);
    t.global_shape = t.local_shape;
    t.global_offset.assign(nd, 0);
    std::int64_t n = cairn::numel(t.local_shape);
    std::int64_t b = rng() % (n + 1), e = rng() % (n + 1);
    if (b > e) std::swap(b, e);
    t.flattened_range = cairn::flat_range{b, e};
    auto pieces = cairn::pieces_of(t);
    CHECK(pieces.size() <= static_cast<std::size_t>(2 * nd));
    // Walk the pieces in order: each must be the next run of flat indices.
    std::int64_t expect = b;
    for (const auto& p : pieces) {
      CHECK(p.data_offset == expect - b);
      cairn::box whole{t.global_offset, t.local_shape};
      cairn::for_each_run(whole, p.region, p.region,
                          [&](std::int64_t s, std::int64_t d, std::int64_t len) {
                            CHECK(s == expect);  // flat index in the block
                            CHECK(d + p.data_offset == expect - b);
                            expect += len;
                          });
    }
    CHECK(expect == e);
  }
}

TEST_CASE("for_each_run merges trailing axes that are whole in both boxes") {
  cairn::box src{{0, 0}, {4, 6}}, dst{{1, 0}, {2, 6}};
  int runs = 0;
  cairn::for_each_run(src, dst, dst, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
    ++runs;
    CHECK(s == 6);
    CHECK(d == 0);
    CHECK(n == 12);
  });
  CHECK(runs == 1);
  cairn::box cols{{0, 2}, {4, 2}};
  std::vector<std::int64_t> starts;
  cairn::for_each_run(src, cols, cols, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
    starts.push_back(s);
    CHECK(n == 2);
    CHECK(d == static_cast<std::int64_t>(starts.size() - 1) * 2);
  });
  CHECK(starts == std::vector<std::int64_t>{2, 8, 14, 20});
  int scalar = 0;
  cairn::for_each_run(cairn::box{}, cairn::box{}, cairn::box{},
                      [&](auto, auto, auto n) { scalar += n; });
  CHECK(scalar == 1);
}
