// check_exact_cover against a brute-force count of every element, on random tilings of 1- to
// 4-d targets that are then perturbed (a box shifted, duplicated, dropped or grown).
#include "cairn/plan/cover.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/support/test_util.hpp"

namespace {

/// How many boxes hold each element of `target` (row-major).
std::vector<int> counts(const std::vector<cairn::box>& boxes, const cairn::box& target) {
  std::vector<int> c(static_cast<std::size_t>(target.volume()), 0);
  for (const auto& b : boxes)
    cairn::for_each_run(target, b, b, [&](std::int64_t s, std::int64_t, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) ++c[static_cast<std::size_t>(s + i)];
    });
  return c;
}

}  // namespace

TEST_CASE("check_exact_cover: simple cases") {
  using cairn::box;
  const box target{{0}, {4}};
  CHECK(!cairn::check_exact_cover(std::vector<box>{{{0}, {2}}, {{2}, {2}}}, target));
  auto overlap = cairn::check_exact_cover(std::vector<box>{{{0}, {2}}, {{1}, {2}}}, target);
  REQUIRE(overlap);
  CHECK(overlap->what == cairn::cover_problem::kind::overlap);
  CHECK(overlap->shared == box{{1}, {1}});
  auto gap = cairn::check_exact_cover(std::vector<box>{{{0}, {3}}}, target);
  REQUIRE(gap);
  CHECK(gap->what == cairn::cover_problem::kind::gap);
  CHECK(gap->covered == 3);
  CHECK(gap->wanted == 4);
  CHECK(gap->missing == box{{3}, {1}});
  // No box at all, and only empty boxes: the whole target is missing.
  CHECK(cairn::check_exact_cover(std::vector<box>{}, target)->missing == target);
  CHECK(cairn::check_exact_cover(std::vector<box>{{{1}, {0}}, {{2}, {0}}}, target)->missing ==
        target);
  // Empty boxes hold nothing; a scalar needs exactly one box.
  CHECK(!cairn::check_exact_cover(std::vector<box>{{{0}, {4}}, {{2}, {0}}}, target));
  CHECK(!cairn::check_exact_cover(std::vector<box>{box{}}, box{}));
  CHECK(cairn::check_exact_cover(std::vector<box>{box{}, box{}}, box{}));
  CHECK(cairn::check_exact_cover(std::vector<box>{}, box{}));
  // Column shards: every box spans all rows.
  CHECK(!cairn::check_exact_cover(
      std::vector<box>{{{0, 0}, {8, 3}}, {{0, 3}, {8, 3}}, {{0, 6}, {8, 2}}}, box{{0, 0}, {8, 8}}));
  CHECK(cairn::check_exact_cover(
      std::vector<box>{{{0, 0}, {8, 3}}, {{0, 2}, {8, 3}}, {{0, 6}, {8, 2}}}, box{{0, 0}, {8, 8}}));
}

TEST_CASE("check_exact_cover agrees with counting every element") {
  std::mt19937 rng(42);
  int exact = 0, overlaps = 0, gaps = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::size_t nd = 1 + rng() % 4;
    cairn::shape global(nd);
    for (auto& g : global) g = 1 + static_cast<std::int64_t>(rng() % 7);
    const cairn::box target{cairn::shape(nd, 0), global};
    auto g = cairn_test::random_grid(rng, global, 1 + static_cast<int>(rng() % 12));
    std::vector<cairn::box> boxes;
    for (std::int64_t c = 0; c < g.cells(); ++c) boxes.push_back(g.cell(c));
    std::shuffle(boxes.begin(), boxes.end(), rng);
    switch (rng() % 5) {
      case 0:  // unchanged
        break;
      case 1:  // shift one box by one along an axis, staying inside the target
        for (auto& b : boxes) {
          std::size_t a = rng() % nd;
          if (b.offset[a] + b.size[a] < global[a]) {
            ++b.offset[a];
            break;
          }
          if (b.offset[a] > 0) {
            --b.offset[a];
            break;
          }
        }
        break;
      case 2:  // one box listed twice
        boxes.push_back(boxes[rng() % boxes.size()]);
        break;
      case 3:  // one box missing
        boxes.erase(boxes.begin() + static_cast<std::ptrdiff_t>(rng() % boxes.size()));
        break;
      case 4:  // one box replaced by a copy of another (a duplicate hiding a gap)
        if (boxes.size() > 1) boxes[0] = boxes[1];
        break;
    }
    auto c = counts(boxes, target);
    bool any_over = std::any_of(c.begin(), c.end(), [](int x) { return x > 1; });
    bool any_gap = std::any_of(c.begin(), c.end(), [](int x) { return x == 0; });
    auto p = cairn::check_exact_cover(boxes, target);
    INFO("iteration " << iter);
    if (!any_over && !any_gap) {
      CHECK(!p);
      ++exact;
    } else if (any_over) {
      REQUIRE(p);
      CHECK(p->what == cairn::cover_problem::kind::overlap);
      REQUIRE(p->first != p->second);
      auto x = cairn::intersect(boxes[p->first], boxes[p->second]);
      REQUIRE(x);
      CHECK(*x == p->shared);
      ++overlaps;
    } else {
      REQUIRE(p);
      CHECK(p->what == cairn::cover_problem::kind::gap);
      CHECK(p->covered < p->wanted);
      // The missing box lies in the target and no box holds any of its elements.
      REQUIRE(p->missing);
      CHECK(target.contains(*p->missing));
      CHECK(p->missing->volume() > 0);
      for (const auto& b : boxes) CHECK(!(b.volume() > 0 && cairn::intersect(b, *p->missing)));
      ++gaps;
    }
  }
  CHECK(exact > 300);
  CHECK(overlaps > 300);
  CHECK(gaps > 300);
}

TEST_CASE("check_exact_cover is fast on large grids") {
  // 256 x 256 tiles of a 2-d tensor and 32 x 32 x 32 of a 3-d one (grids, as shardings are).
  for (std::size_t nd : {2u, 3u}) {
    const std::int64_t per = nd == 2 ? 256 : 32;
    cairn::shape global(nd, per * 4);
    std::vector<cairn::box> boxes;
    std::vector<std::int64_t> idx(nd, 0);
    for (std::int64_t c = 0;; ++c) {
      cairn::box b{cairn::shape(nd), cairn::shape(nd, 4)};
      for (std::size_t a = 0; a < nd; ++a) b.offset[a] = idx[a] * 4;
      boxes.push_back(b);
      std::size_t a = nd;
      while (a-- > 0 && ++idx[a] == per) idx[a] = 0;
      if (a == static_cast<std::size_t>(-1)) break;
    }
    std::shuffle(boxes.begin(), boxes.end(), std::mt19937(1));
    CHECK(!cairn::check_exact_cover(boxes, cairn::box{cairn::shape(nd, 0), global}));
    boxes.back().offset[0] ^= 4;  // moved onto a neighbour's place
    CHECK(cairn::check_exact_cover(boxes, cairn::box{cairn::shape(nd, 0), global}));
  }
}
