// bench/plan_sweep.hpp: `cairn-bench --plan`: the cost of save planning at scale, simulated in
// one process with metadata only (no data, no I/O).
//
// R ranks form a TP=8 × PP × DP grid. T weight tensors ([4096, 4096] bf16) are split over TP
// along alternating axes and spread over PP stages; every DP group holds a replica. Each weight
// has two Adam moments (f32), stored as a distributed optimizer does: every DP rank holds a flat
// slice of its TP block. The bench builds every rank's description, serializes and decodes it
// (what the all-gather moves), validates access integrity, plans the layout and encodes
// metadata.json, and reports the time, the peak resident memory and the metadata size.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn_bench {

/// One point of the planning sweep.
struct plan_point {
  int ranks = 0, tensors = 0, tp = 0, pp = 0, dp = 0;
  std::size_t chunks = 0;
  double plan_ms = 0;
  double peak_rss_mb = 0;
  std::size_t metadata_bytes = 0;
  std::size_t gathered_bytes = 0;  ///< bytes every rank receives from the all-gather
};

inline double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

/// The TP × PP × DP grid of the simulation and the leaves it gives each rank.
struct grid {
  int ranks, tensors, tp, pp, dp;
  static constexpr std::int64_t rows = 4096, cols = 4096;

  /// Which of the three leaves of weight `t` (0: weight, 1 and 2: the Adam moments).
  static std::string key(int t, int kind) {
    std::string w = "layers." + std::to_string(t) + ".weight";
    return kind == 0 ? w : "optim." + w + (kind == 1 ? ".exp_avg" : ".exp_avg_sq");
  }
  /// The weight and kind a `key` names (the inverse of `key(t, kind)`).
  static std::pair<int, int> parse_key(const std::string& key) {
    int t = std::stoi(key.substr(key.find("layers.") + 7));
    int kind = key.ends_with(".exp_avg") ? 1 : key.ends_with(".exp_avg_sq") ? 2 : 0;
    return {t, kind};
  }
  int stage(int t) const { return t % pp; }
  /// The ranks of stage `s` (every rank holding its tensors).
  std::vector<int> ranks_of_stage(int s) const {
    std::vector<int> out;
    for (int d = 0; d < dp; ++d)
      for (int k = 0; k < tp; ++k) out.push_back(k + tp * s + tp * pp * d);
    return out;
  }
  /// Rank r's leaf `kind` of weight t (r must be in t's stage).
  cairn::tensor_desc leaf(int r, int t, int kind) const {
    int k = r % tp, d = r / (tp * pp);
    int axis = t % 2;
    cairn::box blk{{0, 0}, {rows, cols}};
    blk.size[axis] /= tp;
    blk.offset[axis] = blk.size[axis] * k;
    if (kind == 0) return {key(t, 0), cairn::dtype::bf16, {rows, cols}, d, {blk}};
    cairn::tensor_desc od{key(t, kind), cairn::dtype::f32, {rows, cols}, 0, {}};
    std::int64_t v = blk.volume();
    for (const auto& pc : cairn::flat_range_boxes(blk, v * d / dp, v * (d + 1) / dp))
      od.pieces.push_back(pc.region);
    return od;
  }
  /// Every leaf of rank r.
  cairn::rank_desc leaves_of(int r) const {
    cairn::rank_desc d;
    if (r == 0) d.save_id = "bench";
    for (int t = (r / tp) % pp; t < tensors; t += pp)
      for (int kind = 0; kind < 3; ++kind) d.tensors.push_back(leaf(r, t, kind));
    d.commons.push_back(cairn::common_desc{"step", 42});
    return d;
  }
};

/// The grid of `ranks` ranks (TP 8 when possible) with `tensors` weights and `pp` stages.
inline grid make_grid(int ranks, int tensors, int pp) {
  grid g{ranks, tensors, std::min(8, ranks), 1, 1};
  g.pp = pp > 0 ? pp : std::max(1, std::min(8, ranks / g.tp));
  g.dp = std::max(1, ranks / (g.tp * g.pp));
  if (g.tp * g.pp * g.dp != ranks) throw std::runtime_error("ranks must be tp x pp x dp");
  return g;
}

/// Builds every rank's description for the grid and plans the save.
inline plan_point simulate_plan(int ranks, int tensors) {
  plan_point p;
  p.ranks = ranks;
  p.tensors = tensors;
  const grid g = make_grid(ranks, tensors, 0);  // as many stages as fit (at most 8)
  p.tp = g.tp;
  p.pp = g.pp;
  p.dp = g.dp;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<cairn::bytes> wire(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) wire[static_cast<std::size_t>(r)] = cairn::encode(g.leaves_of(r));
  for (const auto& w : wire) p.gathered_bytes += w.size();
  std::vector<cairn::rank_desc> all;
  all.reserve(wire.size());
  for (const auto& w : wire) all.push_back(cairn::decode_rank_desc(w).value());
  wire.clear();
  wire.shrink_to_fit();
  if (auto v = cairn::validate_integrity(all); !v)
    std::fprintf(stderr, "plan bench: integrity check failed: %s\n", v.err().describe().c_str());
  cairn::save_index index = cairn::plan_save(all, cairn::default_block_size);
  for (const auto& [k, t] : index.tensors) p.chunks += t.chunks.size();
  // The native metadata, with checksums as a real save would have them.
  cairn::checkpoint_metadata m = cairn::native_strategy::metadata_of(index, "bench", {});
  for (auto& [k, t] : m.tensors)
    for (auto& c : t.chunks)
      c.where.checksums.assign(cairn::detail::chunk_blocks(c, cairn::default_block_size), 0);
  p.metadata_bytes = cairn::to_json(m).size();
  p.plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  p.peak_rss_mb = peak_rss_mb();
  return p;
}

inline std::string plan_point_json(const plan_point& p) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"ranks\":%d,\"tensors\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"chunks\":%zu,"
                "\"plan_ms\":%.1f,\"peak_rss_mb\":%.1f,\"metadata_bytes\":%zu,"
                "\"gathered_bytes\":%zu}",
                p.ranks, p.tensors, p.tp, p.pp, p.dp, p.chunks, p.plan_ms, p.peak_rss_mb,
                p.metadata_bytes, p.gathered_bytes);
  return buf;
}

}  // namespace cairn_bench
