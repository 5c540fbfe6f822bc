// tests/plan/scalable_cases.hpp: random descriptions of a world's leaves and the checks that a
// scalable plan of them writes every element once, from a holder; shared by the thread-rank
// and mpirun tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cairn/pipeline/scalable_plan.hpp"

namespace cairn_test {

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

/// How a generated tensor is spread over the ranks.
enum class spread { split, replicated, flat_slices, tp_dp, single };

/// Every rank's description of a random mix of shardings (and objects and commons).
inline std::vector<rank_desc> random_world(int world, std::uint32_t seed, int tensors) {
  std::mt19937 rng(seed);
  std::vector<rank_desc> d(static_cast<std::size_t>(world));
  d[0].save_id = "id";
  for (int t = 0; t < tensors; ++t) {
    std::string key = "t" + std::to_string(t);
    cairn::shape g = t % 4 == 3 ? cairn::shape{static_cast<std::int64_t>(1 + rng() % 6),
                                               static_cast<std::int64_t>(1 + rng() % 5),
                                               static_cast<std::int64_t>(1 + rng() % 4)}
                                : cairn::shape{static_cast<std::int64_t>(1 + rng() % 40),
                                               static_cast<std::int64_t>(1 + rng() % 9)};
    auto type = t % 3 ? cairn::dtype::f32 : cairn::dtype::bf16;
    auto how = static_cast<spread>(rng() % 5);
    int axis = static_cast<int>(rng() % 2);
    for (int r = 0; r < world; ++r) {
      tensor_desc td{key, type, g, 0, {}};
      box whole{cairn::shape(g.size(), 0), g};
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
          for (const auto& p : cairn::flat_range_boxes(whole, whole.volume() * r / world,
                                                       whole.volume() * (r + 1) / world))
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
    d[static_cast<std::size_t>(r)].objects.push_back(cairn::object_desc{"shared", {1}, {0}, r, 7});
    d[static_cast<std::size_t>(r)].commons.push_back(cairn::common_desc{"step", 42});
  }
  return d;
}

/// Row-major index of `at` inside `b`.
inline std::int64_t index_in(const box& b, const cairn::shape& at) {
  std::int64_t i = 0;
  for (std::size_t a = 0; a < at.size(); ++a) i = i * b.size[a] + (at[a] - b.offset[a]);
  return i;
}

/// Every element of every tensor, counted once per chunk that writes it; and every object
/// key, counted once per writer.
struct written_counts {
  std::map<std::string, std::vector<int>> elements;
  std::map<std::string, int> objects;
};

/// Checks rank `r`'s index: each slot is a piece its leaf holds, from the right element, laid
/// out one after the other; adds what it writes to `counts`.
inline void check_rank_index(const std::vector<rank_desc>& d,
                             std::size_t r,
                             const cairn::scalable_agreement& got,
                             written_counts& counts) {
  const cairn::save_index& L = got.index;
  CHECK(got.save_id == "id");
  std::uint64_t offset = 0;
  for (const cairn::write_slot& s : L.slots[r]) {
    const cairn::extent& e =
        s.is_object ? L.objects.at(s.key).where : L.tensors.at(s.key).chunks.at(s.chunk).where;
    CHECK(e.file == r);
    CHECK(e.byte_offset == offset);  // laid out one after the other
    offset += e.nbytes;
    if (s.is_object) {
      ++counts.objects[s.key];
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
    CHECK(e.nbytes ==
          static_cast<std::uint64_t>(ch.region.volume()) * cairn::dtype_size(leaf.type));
    auto& c = counts.elements[s.key];
    box whole{cairn::shape(leaf.global_shape.size(), 0), leaf.global_shape};
    c.resize(static_cast<std::size_t>(whole.volume()));
    cairn::for_each_run(whole, ch.region, ch.region,
                        [&](std::int64_t at, std::int64_t, std::int64_t n) {
                          for (std::int64_t i = 0; i < n; ++i)
                            ++c[static_cast<std::size_t>(at + i)];
                        });
  }
  CHECK(L.bytes_of_rank[r] == offset);
}

/// Every element of `d`'s tensors as one vector, tensor after tensor in rank 0's order.
inline std::vector<int> flat_counts(const std::vector<rank_desc>& d, written_counts& counts) {
  std::vector<int> out;
  for (const auto& t : d[0].tensors) {
    auto& c = counts.elements[t.key];
    c.resize(static_cast<std::size_t>(cairn::numel(t.global_shape)));
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

/// Checks that the writers' indexes together write every element of every tensor once, each
/// from a piece its writer holds, and every main object once.
inline void check_covers_once(const std::vector<rank_desc>& d,
                              const std::vector<cairn::result<cairn::scalable_agreement>>& got) {
  written_counts counts;
  for (std::size_t r = 0; r < got.size(); ++r) {
    REQUIRE(got[r]);
    check_rank_index(d, r, *got[r], counts);
  }
  std::vector<int> all = flat_counts(d, counts);
  CHECK(std::all_of(all.begin(), all.end(), [](int c) { return c == 1; }));
  CHECK(counts.objects.size() == d.size() + 1);  // obj/shard_* per rank, and "shared" once
  for (const auto& [k, n] : counts.objects) CHECK(n == 1);
}

}  // namespace cairn_test
