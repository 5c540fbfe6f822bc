// The save planner (plan_save) and validate_integrity, tested directly: pure functions over
// descriptions and boxes, no storage, no communicator.
#include "cairn/plan/save_plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace {

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

/// A rank holding `pieces` of a [rows, cols] f32 tensor "w" with replica id `replica`.
rank_desc holding(std::vector<box> pieces, int replica = 0, cairn::shape global = {8, 4}) {
  rank_desc d;
  d.tensors.push_back(tensor_desc{"w", cairn::dtype::f32, global, replica, std::move(pieces)});
  return d;
}

/// Every element of the tensor, counted once per chunk that holds it.
std::vector<int> coverage(const cairn::tensor_record& t) {
  box whole{cairn::shape(t.global_shape.size(), 0), t.global_shape};
  std::vector<int> c(static_cast<std::size_t>(whole.volume()), 0);
  for (const auto& ch : t.chunks)
    cairn::for_each_run(whole, ch.region, ch.region,
                        [&](std::int64_t s, std::int64_t, std::int64_t n) {
                          for (std::int64_t i = 0; i < n; ++i) ++c[static_cast<std::size_t>(s + i)];
                        });
  return c;
}

}  // namespace

TEST_CASE("plan_save: chunks tile the tensor once, extents name the writing rank") {
  // Rows 0-3 on rank 0, rows 4-7 on rank 1; rank 2 replicates rank 0's rows.
  std::vector<rank_desc> ranks{holding({box{{0, 0}, {4, 4}}}), holding({box{{4, 0}, {4, 4}}}),
                               holding({box{{0, 0}, {4, 4}}}, 1)};
  cairn::save_index L = cairn::plan_save(ranks, /*block_size=*/16, /*split_min_bytes=*/16, false);
  CHECK(L.world_size == 3);
  const cairn::tensor_record& w = L.tensors.at("w");
  for (int n : coverage(w)) CHECK(n == 1);
  std::uint64_t total = 0;
  for (int r = 0; r < 3; ++r) total += L.bytes_of_rank[static_cast<std::size_t>(r)];
  CHECK(total == 8 * 4 * 4);
  // The replicated rows are split between their two holders: rank 2 writes something.
  CHECK(L.writes(2));
  CHECK(L.bytes_of_rank[2] > 0);
  // Every extent names a rank, with offsets that run through what that rank writes.
  std::map<std::uint32_t, std::uint64_t> next;
  for (std::size_t r = 0; r < L.slots.size(); ++r)
    for (const auto& s : L.slots[r]) {
      const cairn::extent& e = L.where(s);
      CHECK(e.file == r);
      CHECK(e.byte_offset == next[e.file]);
      next[e.file] += e.nbytes;
    }
  CHECK(!L.tiled());
}

TEST_CASE("plan_save: deterministic, tiles only when asked") {
  std::vector<rank_desc> ranks{holding({box{{0, 0}, {8, 2}}}), holding({box{{0, 2}, {8, 2}}})};
  cairn::save_index a = cairn::plan_save(ranks, 16, 1 << 16, true);
  cairn::save_index b = cairn::plan_save(ranks, 16, 1 << 16, true);
  CHECK(a.tiled());  // 64-byte boxes, 16-byte blocks
  REQUIRE(a.tensors.at("w").chunks.size() == b.tensors.at("w").chunks.size());
  for (std::size_t i = 0; i < a.tensors.at("w").chunks.size(); ++i) {
    CHECK(a.tensors.at("w").chunks[i].region == b.tensors.at("w").chunks[i].region);
    CHECK(a.tensors.at("w").chunks[i].tiles == b.tensors.at("w").chunks[i].tiles);
  }
  CHECK(!cairn::plan_save(ranks, 16, 1 << 16, false).tiled());
}

TEST_CASE("validate_integrity: a gap names elements no rank writes") {
  std::vector<rank_desc> ranks{holding({box{{0, 0}, {3, 4}}}), holding({box{{4, 0}, {4, 4}}}),
                               holding({box{{4, 0}, {4, 4}}}, 1)};
  auto r = cairn::validate_integrity(ranks);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "w");
  CHECK(r.err().message.find("cover 28 of 32 elements; none holds [3:4, 0:4]") !=
        std::string::npos);
  // Nobody holds any of it: the whole tensor is named.
  std::vector<rank_desc> none{holding({}), holding({box{{0, 0}, {8, 4}}}, 1)};
  r = cairn::validate_integrity(none);
  REQUIRE(!r);
  CHECK(r.err().message.find("none holds [0:8, 0:4]") != std::string::npos);
}

TEST_CASE("common_holders: group-held values, their lowest holder, and holders that disagree") {
  using cairn::common_desc;
  using cairn::detail::common_holders;
  // Every rank declares "iteration"; a two-stage pipeline: stage 0 is ranks 0-1, stage 1 ranks 2-3.
  auto stage = [](int s, std::uint64_t step_hash) {
    std::vector<common_desc> c{{"iteration", 7, "7"}};
    c.push_back(
        common_desc{"state.s" + std::to_string(s) + ".step", step_hash, std::to_string(step_hash)});
    return c;
  };
  std::vector<std::vector<common_desc>> ranks{stage(0, 3), stage(0, 3), stage(1, 5), stage(1, 5)};
  auto held = common_holders(ranks, true);
  REQUIRE(held);
  CHECK(*held == std::map<std::string, int>{{"state.s0.step", 0}, {"state.s1.step", 2}});
  // The same paths everywhere: nothing is group-held.
  std::vector<std::vector<common_desc>> same{stage(0, 3), stage(0, 3)};
  REQUIRE(common_holders(same, true));
  CHECK(common_holders(same, true)->empty());
  // Two holders of one stage disagree: named with both ranks and values.
  ranks[3] = stage(1, 6);
  auto differ = common_holders(ranks, true);
  REQUIRE(!differ);
  CHECK(differ.err().code == cairn::errc::integrity);
  CHECK(differ.err().key == "state.s1.step");
  CHECK(differ.err().message.find("5 on rank 2, 6 on rank 3") != std::string::npos);
  // Unchecked (validation off), the lowest holder's value is the one saved.
  auto unchecked = common_holders(ranks, false);
  REQUIRE(unchecked);
  CHECK(unchecked->at("state.s1.step") == 2);
  // A value every rank declares must still agree.
  ranks[3] = stage(1, 5);
  ranks[1][0].hash = 8;
  ranks[1][0].shown = "8";
  auto global = common_holders(ranks, true);
  REQUIRE(!global);
  CHECK(global.err().message.find("7 on rank 0, 8 on rank 1") != std::string::npos);
  // validate_integrity checks them the same way.
  std::vector<rank_desc> descs(2);
  descs[0].commons = stage(0, 3);
  descs[1].commons = stage(1, 4);
  CHECK(cairn::validate_integrity(descs));
  descs[1].commons[0].hash = 9;
  CHECK(!cairn::validate_integrity(descs));
}
