// Scalable save planning (plan/scalable.hpp) on thread ranks: every element of every tensor is
// written exactly once, by a rank that holds it, from the right place in that rank's leaf;
// writes spread over holders; errors are validate_integrity's, the same on every rank.
#include "cairn/pipeline/scalable_plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cairn/comm/threads.hpp"
#include "tests/plan/scalable_cases.hpp"
#include "tests/support/message_check.hpp"

namespace {

using namespace cairn_test;
using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

/// Runs scalable_plan on `world` thread ranks; returns each rank's result.
std::vector<cairn::result<cairn::scalable_agreement>> plan_on_threads(
    const std::vector<rank_desc>& d, std::vector<std::optional<cairn::error>> failures = {}) {
  const int world = static_cast<int>(d.size());
  failures.resize(d.size());
  return cairn::run_ranks_collect(world, [&](cairn::thread_communicator& c) {
    return cairn::scalable_plan(d[static_cast<std::size_t>(c.rank())],
                                failures[static_cast<std::size_t>(c.rank())], c, true, 256, 64,
                                true);
  });
}

}  // namespace

TEST_CASE("scalable planning writes every element once, from a holder") {
  for (int world : {1, 2, 3, 4, 6}) {
    for (std::uint32_t seed = 1; seed <= 6; ++seed) {
      INFO("world " << world << " seed " << seed);
      auto d = random_world(world, seed * 7919 + static_cast<std::uint32_t>(world), 24);
      check_covers_once(d, plan_on_threads(d));
    }
  }
}

TEST_CASE("scalable planning spreads the writes of replicated tensors over their holders") {
  constexpr int world = 8;
  std::vector<rank_desc> d(world);
  for (int r = 0; r < world; ++r)
    for (int t = 0; t < 64; ++t)  // 64 tensors of 4 KiB, every rank a replica
      d[r].tensors.push_back(
          tensor_desc{"w" + std::to_string(t), cairn::dtype::f32, {1024}, r, {box{{0}, {1024}}}});
  auto got = plan_on_threads(d);
  std::uint64_t lo = ~0ull, hi = 0;
  for (int r = 0; r < world; ++r) {
    REQUIRE(got[r]);
    lo = std::min(lo, got[r]->index.bytes_of_rank[r]);
    hi = std::max(hi, got[r]->index.bytes_of_rank[r]);
  }
  // 256 KiB in 4 KiB boxes over 8 ranks: every rank writes some, none more than twice its share.
  CHECK(lo > 0);
  CHECK(hi <= 2 * (256 * 1024 / world));
}

TEST_CASE("scalable planning fails on every rank alike, with validate_integrity's errors") {
  constexpr int world = 4;
  auto expect = [&](std::vector<rank_desc> d, const char* needle,
                    std::vector<std::optional<cairn::error>> failures = {}) {
    auto whole = cairn::validate_integrity(d);
    auto got = plan_on_threads(d, failures);
    std::string first;
    for (int r = 0; r < world; ++r) {
      REQUIRE(!got[r]);
      std::string m = got[r].err().describe();
      if (r == 0) first = m;
      CHECK(m == first);
    }
    INFO(first);
    CHECK(first.find(needle) != std::string::npos);
    if (failures.empty()) {
      REQUIRE(!whole);
      CHECK(whole.err().code == got[0].err().code);
    }
  };
  auto base = random_world(world, 11, 12);
  check_covers_once(base, plan_on_threads(base));
  {  // two ranks write the same rows of a split tensor
    auto d = base;
    d[1].tensors.push_back(
        tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {box{{0, 0}, {5, 2}}}});
    d[2].tensors.push_back(
        tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {box{{4, 0}, {4, 2}}}});
    expect(d, "shards overlap: rank 1 and rank 2");
  }
  {  // a gap
    auto d = base;
    d[3].tensors.push_back(tensor_desc{"gap", cairn::dtype::f32, {8, 2}, 0, {box{{0, 0}, {7, 2}}}});
    expect(d, "cover 14 of 16 elements; none holds [7:8, 0:2]");
  }
  {  // dtypes disagree
    auto d = base;
    d[0].tensors.push_back(tensor_desc{"mixed", cairn::dtype::f32, {4}, 0, {box{{0}, {2}}}});
    d[2].tensors.push_back(tensor_desc{"mixed", cairn::dtype::f16, {4}, 0, {box{{2}, {2}}}});
    expect(d, "dtype disagrees across ranks: rank 0 has F32, rank 2 has F16");
  }
  {  // one object saved by two ranks
    auto d = base;
    d[1].objects.push_back(cairn::object_desc{"dup", {1}, {0}, 0, 3});
    d[3].objects.push_back(cairn::object_desc{"dup", {1}, {0}, 0, 3});
    expect(d, "is saved by rank 1 and rank 3");
  }
  {  // common values differ
    auto d = base;
    d[2].commons[0].hash = 43;
    expect(d, "common value differs across ranks: rank 0 and rank 2");
  }
  {  // a value held by ranks 2 and 3 only, which disagree
    auto d = base;
    d[2].commons.push_back(cairn::common_desc{"stage1.step", 5, "5"});
    d[3].commons.push_back(cairn::common_desc{"stage1.step", 6, "6"});
    expect(d, "common value differs across ranks: 5 on rank 2, 6 on rank 3");
  }
  {  // a local failure on rank 2 reaches every rank
    std::vector<std::optional<cairn::error>> f(world);
    f[2] = cairn::make_error(cairn::errc::io, "staging failed");
    expect(base, "staging failed", f);
  }
}

TEST_CASE("scalable planning names each group-held common value's lowest holder on every rank") {
  constexpr int world = 4;
  auto d = random_world(world, 5, 8);
  for (int r = 0; r < world; ++r) {
    const int stage = r / 2;
    d[r].commons.push_back(cairn::common_desc{"stage" + std::to_string(stage) + ".step",
                                              static_cast<std::uint64_t>(10 + stage), ""});
  }
  auto got = plan_on_threads(d);
  for (int r = 0; r < world; ++r) {
    REQUIRE(got[r]);
    CHECK(got[r]->index.common_holders ==
          std::map<std::string, int>{{"stage0.step", 0}, {"stage1.step", 2}});
  }
}

TEST_CASE("what rank 0 says before scalable planning round-trips and refuses truncation") {
  cairn::detail::root_said_message m;
  m.checkpoint_exists = true;
  m.save_id = "0a1b2c";
  m.common_holders = {{"state.s1.step", 2}, {"state.s0.step", 0}};
  cairn_test::check_message(m);
  cairn_test::check_message(
      cairn::detail::planning_start_message{0xabcdef, {{"step", 42, "42"}, {"lr", 7, "0.001"}}});
  cairn_test::check_message(std::uint64_t{0xabcdef});
}
