// Scalable save planning (plan/scalable.hpp) on thread ranks: every element of every tensor is
// written exactly once, by a rank that holds it, from the right place in that rank's leaf;
// writes spread over holders; errors are validate_integrity's, the same on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cairn/comm/threads.hpp"
#include "cairn/plan/scalable.hpp"

namespace {

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

/// How a generated tensor is spread over the ranks.
enum class spread { split, replicated, flat_slices, tp_dp, single };

/// Every rank's description of a random mix of shardings (and objects and commons).
std::vector<rank_desc> random_world(int world, std::uint32_t seed, int tensors) {
  std::mt19937 rng(seed);
  std::vector<rank_desc> d(static_cast<std::size_t>(world));
  d[0].save_id = "id";
  for (int t = 0; t < tensors; ++t) {
    std::string key = "t" + std::to_string(t);
    cairn::shape g{static_cast<std::int64_t>(1 + rng() % 40), static_cast<std::int64_t>(1 + rng() % 9)};
    auto type = t % 3 ? cairn::dtype::f32 : cairn::dtype::bf16;
    auto how = static_cast<spread>(rng() % 5);
    int axis = static_cast<int>(rng() % 2);
    for (int r = 0; r < world; ++r) {
      tensor_desc td{key, type, g, 0, {}};
      box whole{{0, 0}, g};
      auto cut = [&](int i, int n) {  // block i of n (uneven) along `axis`
        box b = whole;
        b.offset[axis] = g[axis] * i / n;
        b.size[axis] = g[axis] * (i + 1) / n - b.offset[axis];
        return b;
      };
      switch (how) {
        case spread::split:
          td.pieces = {cut(r, world)};
          break;
        case spread::replicated:
          td.pieces = {whole};
          td.replica_id = r;
          break;
        case spread::flat_slices:
          for (const auto& p :
               cairn::flat_range_boxes(whole, whole.volume() * r / world, whole.volume() * (r + 1) / world))
            td.pieces.push_back(p.region);
          break;
        case spread::tp_dp: {  // tp = 2 when possible, the rest data-parallel replicas
          int tp = world % 2 == 0 ? 2 : 1;
          td.pieces = {cut(r % tp, tp)};
          td.replica_id = r / tp;
          break;
        }
        case spread::single:
          if (r != t % world) continue;
          td.pieces = {whole};
          break;
      }
      std::erase_if(td.pieces, [](const box& b) { return b.volume() == 0; });
      d[static_cast<std::size_t>(r)].tensors.push_back(std::move(td));
    }
  }
  for (int r = 0; r < world; ++r) {
    d[static_cast<std::size_t>(r)].objects.push_back(
        cairn::object_desc{"obj", {world}, {r}, 0, static_cast<std::uint64_t>(10 + r)});
    d[static_cast<std::size_t>(r)].objects.push_back(
        cairn::object_desc{"shared", {1}, {0}, r, 7});
    d[static_cast<std::size_t>(r)].commons.push_back(cairn::common_desc{"step", 42});
  }
  return d;
}

/// Row-major index of `at` inside `b`.
std::int64_t index_in(const box& b, const cairn::shape& at) {
  std::int64_t i = 0;
  for (std::size_t a = 0; a < at.size(); ++a) i = i * b.size[a] + (at[a] - b.offset[a]);
  return i;
}

/// Runs scalable_plan on `world` thread ranks; returns each rank's result.
std::vector<cairn::result<cairn::scalable_agreement>> plan_on_threads(
    const std::vector<rank_desc>& d, std::vector<std::optional<cairn::error>> failures = {}) {
  const int world = static_cast<int>(d.size());
  failures.resize(d.size());
  return cairn::run_ranks_collect(world, [&](cairn::thread_communicator& c) {
    return cairn::scalable_plan(d[static_cast<std::size_t>(c.rank())],
                                failures[static_cast<std::size_t>(c.rank())], c, true, 256,
                                64, true);
  });
}

/// Checks that the writers' indexes together write every element of every tensor once, each
/// from a piece its writer holds, and every main object once.
void check_covers_once(const std::vector<rank_desc>& d,
                       const std::vector<cairn::result<cairn::scalable_agreement>>& got) {
  std::map<std::string, std::vector<int>> seen;
  std::map<std::string, int> objects;
  std::vector<std::uint64_t> bytes(d.size(), 0);
  for (std::size_t r = 0; r < got.size(); ++r) {
    REQUIRE(got[r]);
    const cairn::save_index& L = got[r]->index;
    CHECK(got[r]->save_id == "id");
    std::uint64_t offset = 0;
    for (const cairn::write_slot& s : L.slots[r]) {
      const cairn::extent& e =
          s.is_object ? L.objects.at(s.key).where : L.tensors.at(s.key).chunks.at(s.chunk).where;
      CHECK(e.file == r);
      CHECK(e.byte_offset == offset);  // laid out one after the other
      offset += e.nbytes;
      if (s.is_object) {
        ++objects[s.key];
        CHECK(d[r].objects.at(s.leaf).replica_id == 0);
        continue;
      }
      const tensor_desc& leaf = d[r].tensors.at(s.leaf);
      REQUIRE(leaf.key == s.key);
      const box& held = leaf.pieces.at(s.piece);
      const cairn::chunk_record& ch = L.tensors.at(s.key).chunks.at(s.chunk);
      auto inside = cairn::intersect(held, ch.region);
      REQUIRE(inside);
      CHECK(inside->volume() == ch.region.volume());  // the writer holds the chunk
      CHECK(s.element == index_in(held, ch.region.offset));
      CHECK(e.nbytes == static_cast<std::uint64_t>(ch.region.volume()) * cairn::dtype_size(leaf.type));
      auto& c = seen[s.key];
      box whole{cairn::shape(leaf.global_shape.size(), 0), leaf.global_shape};
      c.resize(static_cast<std::size_t>(whole.volume()));
      cairn::for_each_run(whole, ch.region, ch.region, [&](std::int64_t at, std::int64_t, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) ++c[static_cast<std::size_t>(at + i)];
      });
    }
    CHECK(L.bytes_of_rank[r] == offset);
    bytes[r] = offset;
  }
  for (const auto& t : d[0].tensors) {
    std::int64_t n = 1;
    for (auto x : t.global_shape) n *= x;
    if (n == 0) continue;
    INFO("tensor " << t.key);
    REQUIRE(seen.count(t.key));
    CHECK(std::all_of(seen[t.key].begin(), seen[t.key].end(), [](int c) { return c == 1; }));
  }
  CHECK(objects.size() == d.size() + 1);  // obj/shard_* per rank, and "shared" once
  for (const auto& [k, n] : objects) CHECK(n == 1);
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
    d[1].tensors.push_back(tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {box{{0, 0}, {5, 2}}}});
    d[2].tensors.push_back(tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {box{{4, 0}, {4, 2}}}});
    expect(d, "shards overlap: rank 1 and rank 2");
  }
  {  // a gap
    auto d = base;
    d[3].tensors.push_back(tensor_desc{"gap", cairn::dtype::f32, {8, 2}, 0, {box{{0, 0}, {7, 2}}}});
    expect(d, "shards leave a gap");
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
    expect(d, "common value differs between rank 0 and rank 2");
  }
  {  // a local failure on rank 2 reaches every rank
    std::vector<std::optional<cairn::error>> f(world);
    f[2] = cairn::make_error(cairn::errc::io, "staging failed");
    expect(base, "staging failed", f);
  }
}
