// tests/system/fuzz/plan_layouts.hpp: the load planner run over a parsed checkpoint as the ranks of
// several worlds would run it, so that a fuzz target reaches the paths that depend on which
// part of a tensor a rank asks for (a piece inside a gap, one that meets no chunk, one across
// a chunk's edge), not only the whole tensor on one rank.
//
// For every tensor (the first `max_tensors`), worlds of 1, 2 and 3 ranks: the rows of axis 0
// split evenly over the ranks, the first and the last element, and the whole tensor. Each
// rank's piece goes through plan_copies; a piece it accepts must be filled exactly by its jobs
// (every job inside its chunk and the piece, the jobs' volumes summing to the piece's); small
// accepted pieces also go through plan_reads into a real buffer, whose reads must stay inside
// their chunks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cairn/format/native/metadata.hpp"
#include "cairn/plan/load_plan.hpp"
#include "tests/system/fuzz/fuzz.hpp"

namespace cairn_fuzz {

/// Tensors of one checkpoint that `plan_on_ranks` plans for (the rest are skipped: a fuzz
/// input's time is bounded).
inline constexpr std::size_t max_tensors = 16;

/// The pieces the ranks of a world of `world` load of a tensor of shape `s`, one per rank: the
/// rows of axis 0 split evenly (some may be empty).
inline std::vector<cairn::box> row_split(const cairn::shape& s, int world) {
  std::vector<cairn::box> out;
  for (int r = 0; r < world; ++r) {
    cairn::box b{cairn::shape(s.size(), 0), s};
    if (!s.empty()) {
      b.offset[0] = s[0] / world * r + std::min<std::int64_t>(r, s[0] % world);
      b.size[0] = s[0] / world + (r < s[0] % world ? 1 : 0);
    }
    out.push_back(b);
  }
  return out;
}

/// Plans one rank's piece `piece` of `rec` and checks what the planner accepts.
inline void plan_piece(const cairn::tensor_record& rec,
                       const std::string& key,
                       const cairn::box& piece,
                       std::uint64_t block_size) {
  std::vector<cairn::detail::copy_job> jobs;
  const std::size_t es = cairn::dtype_size(rec.type);
  // A real buffer for small pieces, so that plan_reads' target pointers are real.
  const bool small = piece.volume() <= (std::int64_t{1} << 16);
  std::vector<std::byte> buf(small ? static_cast<std::size_t>(piece.volume()) * es : 0);
  auto r = cairn::detail::plan_copies(rec, key, piece, small ? buf.data() : nullptr, jobs);
  if (!r) {
    check(jobs.empty(), "plan_copies failed but left jobs behind");
    check(!r.err().message.empty() && r.err().key == key,
          "plan_copies failed without a message naming the key");
    return;
  }
  std::int64_t filled = 0;
  for (const auto& j : jobs) {
    check(j.chunk->region.contains(j.region) && piece.contains(j.region),
          "a copy job lies outside its chunk or its piece");
    filled += j.region.volume();
  }
  const cairn::box whole{cairn::shape(rec.global_shape.size(), 0), rec.global_shape};
  const auto inside =
      piece.size.empty() ? std::optional<cairn::box>(piece) : cairn::intersect(piece, whole);
  check(filled == (inside ? inside->volume() : 0),
        "accepted copy jobs do not fill the piece exactly");
  if (!small || block_size == 0) return;
  const auto plan = cairn::detail::plan_reads(jobs, block_size, 4 * block_size, 16 * block_size);
  for (const auto& op : plan.ops)
    check(op.first_block <= op.last_block &&
              op.first_block * block_size < std::max<std::uint64_t>(op.chunk->where.nbytes, 1),
          "a planned read starts past the end of its chunk");
}

/// Runs the load planner for every rank of worlds of 1, 2 and 3 over every tensor of `m`
/// (the first `max_tensors`), as described in the file comment.
inline void plan_on_ranks(const cairn::checkpoint_metadata& m) {
  std::size_t n = 0;
  for (const auto& [key, rec] : m.tensors) {
    if (n++ == max_tensors) break;
    const cairn::shape& s = rec.global_shape;
    std::vector<cairn::box> pieces;
    for (int world = 1; world <= 3; ++world)
      for (const auto& b : row_split(s, world)) pieces.push_back(b);
    if (std::all_of(s.begin(), s.end(), [](std::int64_t d) { return d > 0; })) {
      cairn::box first{cairn::shape(s.size(), 0), cairn::shape(s.size(), 1)};
      cairn::box last = first;
      for (std::size_t a = 0; a < s.size(); ++a) last.offset[a] = s[a] - 1;
      pieces.push_back(first);
      pieces.push_back(last);
    }
    for (const auto& p : pieces) plan_piece(rec, key, p, m.block_size);
  }
}

}  // namespace cairn_fuzz
