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

TEST_CASE("choose_tiles: block tiles, and slabs along sharded axes for format version 4") {
  using cairn::box;
  // A [512, 2048] bf16 part of a [2048, 2048] tensor (split along axis 0): 2 MiB.
  const box rows{{512, 0}, {512, 2048}};
  const cairn::shape global{2048, 2048};
  // Block tiles: halved until a tile fits 1 MiB, the sharded axis first.
  auto k = cairn::choose_tiles(rows, 2, std::uint64_t{1} << 20, global);
  CHECK(k == cairn::shape{2, 1});
  // Slabs: 64 along the sharded axis (8 rows, 32 KiB each), none along the whole axis.
  k = cairn::choose_tiles(rows, 2, std::uint64_t{1} << 20, global, cairn::index_slabs);
  CHECK(k == cairn::shape{64, 1});
  // A small part: slabs stop at min_slab_bytes; a part that fits a block is still cut.
  const box small{{0, 0}, {128, 256}};  // 64 KiB of bf16: 2 slabs of 32 KiB, axes in order
  CHECK(cairn::choose_tiles(small, 2, std::uint64_t{1} << 20, global).empty());
  CHECK(cairn::choose_tiles(small, 2, std::uint64_t{1} << 20, global, cairn::index_slabs) ==
        cairn::shape{2, 1});
  // Slabs come on top of the block tiles, never instead: a [512, 2048] f32 row block with
  // 64 KiB blocks keeps its 8 x 8 block tiles (loads on 2, 4, 8 ranks along either axis stay
  // exact) and gets twice the cuts along its sharded axis (tiles of 32 KiB).
  CHECK(cairn::choose_tiles(rows, 4, std::uint64_t{64} << 10, global) == cairn::shape{8, 8});
  CHECK(cairn::choose_tiles(rows, 4, std::uint64_t{64} << 10, global, cairn::index_slabs) ==
        cairn::shape{16, 8});
  // The whole tensor (nothing sharded): slabs change nothing.
  const box whole{{0, 0}, {2048, 2048}};
  CHECK(cairn::choose_tiles(whole, 2, std::uint64_t{1} << 20, global, cairn::index_slabs) ==
        cairn::choose_tiles(whole, 2, std::uint64_t{1} << 20, global));
  // Every slab tiling covers the box exactly with tiles of at most a block.
  for (const auto& b : {rows, small, box{{3, 5}, {7, 1000}}}) {
    auto t = cairn::choose_tiles(b, 4, 4096, global, cairn::index_slabs);
    std::int64_t volume = 0;
    cairn::for_each_tile(b, t, [&](const box& tile) {
      CHECK(static_cast<std::uint64_t>(tile.volume()) * 4 <= 4096);
      volume += tile.volume();
    });
    CHECK(volume == b.volume());
  }
}
