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

/// Builds every rank's description for the grid and plans the save.
inline plan_point simulate_plan(int ranks, int tensors) {
  plan_point p;
  p.ranks = ranks;
  p.tensors = tensors;
  p.tp = std::min(8, ranks);
  p.pp = std::max(1, std::min(8, ranks / p.tp));
  p.dp = std::max(1, ranks / (p.tp * p.pp));
  const std::int64_t rows = 4096, cols = 4096;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<cairn::bytes> wire(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    int tp = r % p.tp, pp = (r / p.tp) % p.pp, dp = r / (p.tp * p.pp);
    cairn::rank_desc d;
    if (r == 0) d.save_id = "bench";
    for (int t = pp; t < tensors; t += p.pp) {
      std::string key = "layers." + std::to_string(t) + ".weight";
      int axis = t % 2;
      cairn::box blk{{0, 0}, {rows, cols}};
      blk.size[axis] /= p.tp;
      blk.offset[axis] = blk.size[axis] * tp;
      d.tensors.push_back(cairn::tensor_desc{key, cairn::dtype::bf16, {rows, cols}, dp, {blk}});
      std::int64_t v = blk.volume();
      for (const char* m : {"exp_avg", "exp_avg_sq"}) {
        cairn::tensor_desc od{"optim." + key + "." + m, cairn::dtype::f32, {rows, cols}, 0, {}};
        for (const auto& pc : cairn::flat_range_boxes(blk, v * dp / p.dp, v * (dp + 1) / p.dp))
          od.pieces.push_back(pc.region);
        d.tensors.push_back(std::move(od));
      }
    }
    d.commons.push_back(cairn::common_desc{"step", 42});
    wire[static_cast<std::size_t>(r)] = cairn::encode(d);
  }
  for (const auto& w : wire) p.gathered_bytes += w.size();
  std::vector<cairn::rank_desc> all;
  all.reserve(wire.size());
  for (const auto& w : wire) all.push_back(cairn::decode_rank_desc(w));
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
      c.where.checksums.assign(
          c.tiles.empty()
              ? (c.where.nbytes + cairn::default_block_size - 1) / cairn::default_block_size
              : static_cast<std::uint64_t>(cairn::tile_count(c.region, c.tiles)),
          0);
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
