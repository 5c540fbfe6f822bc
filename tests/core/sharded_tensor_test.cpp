// dtype table, float conversions, sharded tensor factories and layout validation, codecs and
// common values.
#include "cairn/core/sharded_tensor.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/sharded_object.hpp"
#include "tests/support/test_util.hpp"

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

namespace {
/// A typed tree holding one f64 tensor (at namespace scope: a local class cannot hold the
/// static `fields` member).
struct f64_state {
  cairn::sharded_tensor<double> w;
  static constexpr auto fields = cairn::field_names("w");
};
}  // namespace

TEST_CASE("a typed sharded_tensor<T> saves as T's dtype whatever its type field says") {
  std::vector<double> data{1.5, -2.25, 3.0, 4.125};
  f64_state s;
  s.w.key = "w";
  s.w.type = cairn::dtype::f32;  // wrong, and never consulted for a typed tensor
  s.w.local_shape = s.w.global_shape = {4};
  s.w.global_offset = {0};
  s.w.data = data;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save(s, mem, one);
  auto t = cairn::load_tensors(mem, {"w"}).value();
  CHECK(t.at("w").type == cairn::dtype::f64);
  auto back = t.at("w").as<double>();
  CHECK(std::vector<double>(back.begin(), back.end()) == data);
  cairn::state_dict sd;
  sd.add("w", s.w);  // the conversion to sharded_tensor<> takes T's dtype too
  CHECK(std::get<cairn::sharded_tensor<>>(*sd.find("w")).type == cairn::dtype::f64);
}

TEST_CASE("from_rank_offsets with splits built at run time, and from_rank_offsets_flat") {
  // A [4, 6] f32 tensor: 2 tensor-parallel row blocks, each held by 2 ranks of a distributed
  // optimizer as flat halves; the splits come from a vector built at run time.
  const cairn::shape global{4, 6};
  cairn::memory_storage mem;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    const int tp = comm.rank() / 2, half = comm.rank() % 2;
    std::vector<cairn::axis_split> splits;
    splits.push_back({0, tp, 2});
    std::vector<std::byte> block(2 * 6 * 4);
    cairn_test::fill_block("w", cairn::dtype::f32, global, cairn::box{{2 * tp, 0}, {2, 6}},
                           block.data());
    std::vector<float> mine(6);
    std::memcpy(mine.data(), block.data() + half * 6 * 4, 6 * 4);
    auto w = cairn::from_rank_offsets_flat("w", std::span(mine), {2, 6}, splits,
                                           cairn::flat_range{6 * half, 6 * half + 6});
    auto same = cairn::from_rank_offsets("w", std::span(mine), {2, 6}, {{0, tp, 2}});
    CHECK(w.global_shape == same.global_shape);
    CHECK(w.global_offset == same.global_offset);
    CHECK(w.axis_fragmentations == same.axis_fragmentations);
    cairn::state_dict sd;
    sd.add("w", w);
    cairn::save(sd, mem, comm);
  });
  auto t = cairn::load_tensors(mem, {"w"}).value();
  std::vector<std::byte> want(4 * 6 * 4);
  cairn_test::fill_block("w", cairn::dtype::f32, global, cairn::box{{0, 0}, global}, want.data());
  CHECK(t.at("w").data == want);
}

TEST_CASE("even_split covers an axis exactly on any number of ranks") {
  for (std::int64_t size : {0, 1, 7, 12, 1024}) {
    for (int count = 1; count <= 7; ++count) {
      CAPTURE(size);
      CAPTURE(count);
      std::int64_t next = 0;
      for (int i = 0; i < count; ++i) {
        auto p = cairn::even_split(size, i, count);
        CHECK(p.offset == next);  // contiguous, in rank order
        CHECK(p.size >= size / count);
        CHECK(p.size <= size / count + 1);
        next = p.end();
      }
      CHECK(next == size);  // nothing left over, nothing past the end
    }
  }
  CHECK(cairn::even_split(1024, 0, 3) == cairn::even_part{0, 342});
  CHECK(cairn::even_split(1024, 2, 3) == cairn::even_part{683, 341});
  CHECK(cairn::even_flat_range(10, 1, 4) == cairn::flat_range{3, 6});
  CHECK_THROWS_AS(cairn::even_split(10, 4, 4), cairn::exception);
  CHECK_THROWS_AS(cairn::even_split(10, 0, 0), cairn::exception);
  CHECK_THROWS_AS(cairn::even_split(-1, 0, 2), cairn::exception);
}

TEST_CASE("even_block describes a rank's rows of an uneven split, valid for its buffer") {
  // 12 rows over 5 ranks: 3, 3, 2, 2, 2 (12 / 5 = 2 would describe only 10 rows).
  std::int64_t rows = 0;
  for (int r = 0; r < 5; ++r) {
    auto part = cairn::even_split(12, r, 5);
    std::vector<float> buf(static_cast<std::size_t>(part.size * 8));
    auto t = cairn::even_block("w", std::span(buf), {12, 8}, 0, r, 5);
    CHECK(t.global_shape == cairn::shape{12, 8});
    CHECK(t.local_shape == cairn::shape{part.size, 8});
    CHECK(t.global_offset == cairn::shape{part.offset, 0});
    CHECK(cairn::validate_sharding(t, buf.size()));
    rows += t.local_shape[0];
  }
  CHECK(rows == 12);
  // columns, and errors naming the key
  std::vector<float> cols(12 * 3);
  auto c = cairn::even_block("w", std::span(cols), {12, 8}, 1, 1, 3);
  CHECK(c.global_offset == cairn::shape{0, 3});
  CHECK(c.local_shape == cairn::shape{12, 3});
  try {
    (void)cairn::even_block("layer.w", std::span(cols), {12, 8}, 2, 0, 3);
    FAIL("no throw");
  } catch (const cairn::exception& e) {
    CHECK(e.err().key == "layer.w");
  }
  try {
    (void)cairn::even_block("layer.w", std::span(cols), {12, 8}, 0, 3, 3);
    FAIL("no throw");
  } catch (const cairn::exception& e) {
    CHECK(e.err().key == "layer.w");
    CHECK(e.err().code == cairn::errc::invalid_argument);
  }
}
