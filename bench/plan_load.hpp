// bench/plan_load.hpp: `cairn-bench --plan --load`: what format version 5 (index files with
// grid directories, `save_options::index_files`) costs at scale, simulated in one process with
// metadata only, on plan_sweep.hpp's TP × PP × DP grid:
// - the manifest (metadata.json): its bytes and the time to decode it, for every tensor of the
//   job and one data and one index file per rank;
// - the index files: bytes, estimated from the keys sampled below;
// - load planning of rank 0 (loading the same structure): `read_index_sections` for its tensors
//   (directory, then the grid entries or pages that meet its pieces) from an in-memory index file
//   built from the owners' plans of `sample` of its keys, with the time and bytes scaled up to all
//   of them.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cairn/format/native/reader.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/pipeline/load.hpp"
#include "cairn/pipeline/share.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/memory.hpp"
#include "plan_roles.hpp"

namespace cairn_bench {

/// The coordinator of a default save's commit (format version 5): rank 0 receives every rank's
/// index report (its data file's size, and for each tensor it owns where the directory lies in
/// its index file), merges them into the manifest (`native_strategy::manifest_of`) and encodes
/// it, as JSON: bytes received, milliseconds, and the manifest's bytes.
inline std::string simulate_coordinator(int ranks, int tensors, int pp) {
  using clock = std::chrono::steady_clock;
  grid g = make_grid(ranks, tensors, pp);
  std::vector<cairn::detail::native_index_report> reps(static_cast<std::size_t>(ranks));
  for (int t = 0; t < tensors; ++t)
    for (int kind = 0; kind < 3; ++kind) {
      const cairn::tensor_desc d = g.leaf(0 + g.tp * g.stage(t), t, kind);
      auto& rep = reps[static_cast<std::size_t>(cairn::owner_of(d.key, ranks))];
      auto& f = rep.index ? *rep.index : rep.index.emplace();
      const std::uint64_t at = cairn::index_header_bytes + f.sections.size() * 120;
      f.sections.push_back(
          {d.key, d.type, d.global_shape, at, 120, 0x9e3779b97f4a7c15ull * (at + 1), 1024});
    }
  std::vector<cairn::bytes> reports;
  std::uint64_t received = 0;
  for (int r = 0; r < ranks; ++r) {
    auto& rep = reps[static_cast<std::size_t>(r)];
    rep.writes = true;
    rep.data_size = std::uint64_t{400} << 20;
    if (rep.index) rep.index->size = 1 << 20, rep.index->checksum = static_cast<std::uint64_t>(r);
    reports.push_back(cairn::detail::encode_message(rep));
    if (r != 0) received += reports.back().size();
  }
  reps.clear();
  cairn::save_index index;
  index.world_size = ranks;
  index.block_size = cairn::default_block_size;
  const auto t0 = clock::now();
  cairn::checkpoint_metadata m = cairn::native_strategy::manifest_of(index, "bench", reports);
  const std::string json = cairn::to_json(m);
  const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  return fmt::format("{{\"received\":{},\"ms\":{:.1f},\"manifest_bytes\":{}}}", received, ms,
                     json.size());
}

/// Format version 5 at `ranks` × `tensors` with `pp` stages (0: the default), as JSON.
inline std::string simulate_load(int ranks, int tensors, int pp, int sample) {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  grid g = make_grid(ranks, tensors, pp);
  const cairn::rank_desc me = g.leaves_of(0);
  // Sampled keys of rank 0, each planned by its owner as a save would, then paged.
  cairn::index_file_builder builder;
  std::vector<const cairn::tensor_desc*> picked;
  std::vector<std::uint64_t> chunks_of;  ///< chunk records of each picked key
  std::uint64_t chunks = 0, grids = 0;
  const std::size_t step =
      std::max<std::size_t>(1, me.tensors.size() / static_cast<std::size_t>(std::max(sample, 1)));
  for (std::size_t i = 0; i < me.tensors.size(); i += step) {
    const std::string& key = me.tensors[i].key;
    auto plan = cairn::plan_owned(claims_for_owner(g, {grid::parse_key(key)}), false,
                                  cairn::default_block_size,
                                  cairn::save_options{}.balance_min_bytes, cairn::index_slabs);
    if (!plan) throw std::runtime_error("plan_owned: " + plan.err().describe());
    cairn::tensor_record rec = plan->index.tensors.at(key);
    for (auto& c : rec.chunks)  // one checksum per tile or block, as a save fills them
      c.where.checksums.assign(cairn::detail::chunk_blocks(c, cairn::default_block_size), 0x5eed);
    std::sort(rec.chunks.begin(), rec.chunks.end(),
              [](const auto& a, const auto& b) { return a.region.offset < b.region.offset; });
    chunks += rec.chunks.size();
    grids += cairn::regular_grid(rec).has_value();
    chunks_of.push_back(rec.chunks.size());
    builder.add(key, std::move(rec));
    picked.push_back(&me.tensors[i]);
  }
  const cairn::built_index_file built = builder.finish();
  const cairn::bytes& file = built.file;
  const std::vector<cairn::index_section>& sections = built.directories;
  cairn::memory_storage mem;
  if (!mem.put(cairn::index_file_name(0, "000000000000"), file)) throw std::runtime_error("put");
  // The manifest of the whole job: every tensor, a data and an index file per rank.
  cairn::checkpoint_metadata whole;
  whole.version = cairn::format_version;
  whole.world_size = ranks;
  whole.save_id = "000000000000";
  for (int r = 0; r < ranks; ++r)
    whole.files.push_back({cairn::data_file_name(r, whole.save_id), r, std::uint64_t{1} << 40});
  for (int r = 0; r < ranks; ++r) {
    whole.files.push_back({cairn::index_file_name(r, whole.save_id), r, file.size(),
                           cairn::file_role::index, built.checksum});
  }
  for (int t = 0; t < tensors; ++t)
    for (int kind = 0; kind < 3; ++kind) {
      const cairn::tensor_desc d = g.leaf(0, t, kind);
      whole.tensors[d.key] = cairn::tensor_record{d.type, d.global_shape, {}};
      const auto& s = sections[static_cast<std::size_t>(t + kind) % sections.size()];
      whole.index_refs[d.key] =
          cairn::index_ref{static_cast<std::uint32_t>(ranks + cairn::owner_of(d.key, ranks)),
                           s.offset, s.length, s.checksum, 1};
    }
  const std::string json = cairn::to_json(whole);
  auto t0 = clock::now();
  auto decoded = cairn::metadata_from_json(json, "metadata.json");
  const double manifest_ms = ms_since(t0);
  if (!decoded) throw std::runtime_error("manifest: " + decoded.err().describe());
  // Rank 0's load planning over the sampled keys, all in one index file here.
  cairn::checkpoint_metadata m;
  m.version = cairn::format_version;
  m.world_size = ranks;
  m.save_id = whole.save_id;
  m.files.assign(whole.files.begin(), whole.files.begin() + ranks);
  m.files.push_back(whole.files[static_cast<std::size_t>(ranks)]);
  cairn::index_wants wants;
  for (std::size_t i = 0; i < picked.size(); ++i) {
    const auto& d = *picked[i];
    m.tensors[d.key] = cairn::tensor_record{d.type, d.global_shape, {}};
    m.index_refs[d.key] = cairn::index_ref{static_cast<std::uint32_t>(ranks), sections[i].offset,
                                           sections[i].length, sections[i].checksum, chunks_of[i]};
    wants[d.key] = d.pieces;
  }
  std::uint64_t directory_bytes = 0;
  for (const auto& sec : sections) directory_bytes += sec.length;
  cairn::faulty_storage counted(mem);
  t0 = clock::now();
  auto r = cairn::read_index_sections(counted, m, wants);
  const double load_ms = ms_since(t0);
  if (!r) throw std::runtime_error("read_index_sections: " + r.err().describe());
  // Load dedup (pipeline/share.hpp) with default options, every rank loading what it saved:
  // each rank claims its pieces of at least broadcast_min_bytes at their owners (piece_owner);
  // the busiest owner's received claims are counted over every rank's pieces; rank 0's routes
  // come from route_claims over every claim on its pieces (readers picked as one owner would).
  const cairn::load_options lopt;
  const std::uint64_t min_bytes = lopt.broadcast_min_bytes;
  const auto claim_bytes = [](const cairn::box& b) {  // piece_claim, encoded
    return 4 + 1 + 2 * (8 + 8 * static_cast<std::uint64_t>(b.offset.size()));
  };
  std::map<std::string, std::uint32_t> key_index;  // the manifest's key order
  for (const auto& [k, t] : whole.tensors)
    key_index.emplace(k, static_cast<std::uint32_t>(key_index.size()));
  t0 = clock::now();
  std::vector<std::uint64_t> owner_received(static_cast<std::size_t>(ranks), 0);
  std::uint64_t claims_sent_rank0 = 0, pieces_rank0 = 0;
  using piece_key = std::tuple<std::uint32_t, cairn::shape, cairn::shape>;
  std::map<piece_key, std::vector<int>> rank0_groups;  // rank 0's pieces: who else claims them
  for (const auto& d : g.leaves_of(0).tensors)
    for (const auto& p : d.pieces)
      if (static_cast<std::uint64_t>(p.volume()) * cairn::dtype_size(d.type) >= min_bytes)
        rank0_groups[{key_index.at(d.key), p.offset, p.size}];
  std::vector<int> last_sender(static_cast<std::size_t>(ranks), -1);
  std::set<int> owners_of_rank0;  // each sends rank 0 one list of routes at most
  for (int r = 0; r < ranks; ++r)
    for (const auto& d : g.leaves_of(r).tensors)
      for (const auto& p : d.pieces) {
        if (static_cast<std::uint64_t>(p.volume()) * cairn::dtype_size(d.type) < min_bytes)
          continue;
        const int o = cairn::detail::piece_owner(d.key, p, ranks);
        const auto ou = static_cast<std::size_t>(o);
        if (o != r) owner_received[ou] += claim_bytes(p);
        if (o != r && last_sender[ou] != r) owner_received[ou] += 8, last_sender[ou] = r;
        if (r == 0 && o != 0) owners_of_rank0.insert(o);
        if (r == 0) claims_sent_rank0 += claim_bytes(p), ++pieces_rank0;
        auto it = rank0_groups.find({key_index.at(d.key), p.offset, p.size});
        if (it != rank0_groups.end()) it->second.push_back(r);
      }
  std::vector<std::vector<cairn::detail::piece_claim>> on_rank0(static_cast<std::size_t>(ranks));
  for (const auto& [id, members] : rank0_groups)
    for (int r : members)
      on_rank0[static_cast<std::size_t>(r)].push_back(
          {std::get<0>(id), cairn::dtype::bf16, {std::get<1>(id), std::get<2>(id)}});
  const auto rt0 = clock::now();
  const auto routes = cairn::detail::route_claims(on_rank0, 0);
  const double route_ms = ms_since(rt0);
  std::uint64_t shared_rank0 = 0, rounds = 0;
  for (const auto& route : routes[0]) shared_rank0 += route.parent >= 0;
  for (const auto& of_rank : routes)  // the deepest tree of rank 0's groups
    for (const auto& route : of_rank)
      if (route.parent >= 0) rounds = std::max<std::uint64_t>(rounds, route.round + 1u);
  const std::uint64_t routes_received = cairn::detail::encode_message(routes[0]).size();
  const double dedup_sim_s = std::chrono::duration<double>(clock::now() - t0).count();
  const std::uint64_t busiest_owner =
      *std::max_element(owner_received.begin(), owner_received.end());
  // Every rank's 9-byte schedule (all_gather); an empty list travels as no bytes, a list as its
  // 8-byte count and elements (the owners' counts are in owner_received; rank 0's routes come
  // in a list from each owner of its pieces, bounded here by all of them).
  const std::uint64_t schedule = 9 * static_cast<std::uint64_t>(ranks - 1);
  const std::uint64_t dedup_received_max =
      busiest_owner + routes_received + 8 * owners_of_rank0.size() + schedule;
  std::uint64_t loaded_chunks = 0;
  for (const auto& [k, t] : m.tensors) loaded_chunks += t.chunks.size();
  const double scale = static_cast<double>(me.tensors.size()) / static_cast<double>(picked.size());
  const double keys_total = 3.0 * tensors;
  return fmt::format(
      "{{\"ranks\":{},\"tensors\":{},\"tp\":{},\"pp\":{},\"dp\":{},\"leaves_per_rank\":{},"
      "\"keys_sampled\":{},\"grids_sampled\":{},\"manifest_bytes\":{},\"manifest_decode_ms\":{:.1f}"
      ","
      "\"index_bytes_estimate\":{:.0f},\"chunks_estimate\":{:.0f},"
      "\"load_planning_rank0\":{{\"ms_estimate\":{:.1f},\"index_bytes_read_estimate\":{:.0f},"
      "\"of_them_directories\":{:.0f},"
      "\"chunks_kept_estimate\":{:.0f},\"chunk_records_in_its_tensors_estimate\":{:.0f}}},"
      "\"load_dedup\":{{\"pieces_rank0\":{},\"claim_bytes_rank0\":{},"
      "\"busiest_owner_claims_received\":{},\"routes_rank0\":{},\"route_bytes_rank0\":{},"
      "\"rounds\":{},\"route_ms\":{:.1f},\"received_per_rank_max\":{},"
      "\"simulated_s\":{:.1f}}},"
      "\"coordinator_commit\":{},\"peak_rss_mb\":{:.1f}}}",
      ranks, tensors, g.tp, g.pp, g.dp, me.tensors.size(), picked.size(), grids, json.size(),
      manifest_ms,
      static_cast<double>(file.size()) * keys_total / static_cast<double>(picked.size()),
      static_cast<double>(chunks) * keys_total / static_cast<double>(picked.size()),
      load_ms * scale, static_cast<double>(counted.bytes_read()) * scale,
      static_cast<double>(directory_bytes) * scale, static_cast<double>(loaded_chunks) * scale,
      static_cast<double>(chunks) * scale, pieces_rank0, claims_sent_rank0, busiest_owner,
      shared_rank0, routes_received, rounds, route_ms, dedup_received_max, dedup_sim_s,
      simulate_coordinator(ranks, tensors, pp), peak_rss_mb());
}

/// The write balance of key-owner planning with parts of at least `split_min` bytes: every key
/// of pipeline stage 0 planned by its owner (the owners' keys grouped as `owner_of` picks them),
/// the bytes each rank of the stage writes summed over all of them, as JSON.
inline std::string simulate_balance(int ranks, int tensors, int pp, std::uint64_t split_min) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  grid g = make_grid(ranks, tensors, pp);
  std::map<int, std::vector<std::pair<int, int>>> by_owner;
  for (int t = 0; t < tensors; t += g.pp)
    for (int kind = 0; kind < 3; ++kind)
      by_owner[cairn::owner_of(grid::key(t, kind), ranks)].emplace_back(t, kind);
  std::vector<std::uint64_t> written(static_cast<std::size_t>(ranks), 0);
  std::uint64_t parts = 0;
  for (const auto& [owner, keys] : by_owner) {
    auto plan = cairn::plan_owned(claims_for_owner(g, keys), false, cairn::default_block_size,
                                  split_min, cairn::index_slabs);
    if (!plan) throw std::runtime_error("plan_owned: " + plan.err().describe());
    for (std::size_t r = 0; r < written.size(); ++r) written[r] += plan->index.bytes_of_rank[r];
    for (const auto& [k, t] : plan->index.tensors) parts += t.chunks.size();
  }
  double sum = 0, most = 0, least = 1e300;
  const std::vector<int> stage = g.ranks_of_stage(0);
  for (int r : stage) {
    const auto b = static_cast<double>(written[static_cast<std::size_t>(r)]);
    sum += b;
    most = std::max(most, b);
    least = std::min(least, b);
  }
  const double mean = sum / static_cast<double>(stage.size());
  return fmt::format(
      "{{\"ranks\":{},\"tensors\":{},\"tp\":{},\"pp\":{},\"dp\":{},\"split_min\":{},"
      "\"stage_ranks\":{},\"owners\":{},\"chunks\":{},\"mean_mb\":{:.1f},\"max_mb\":{:.1f},"
      "\"min_mb\":{:.1f},\"max_over_mean\":{:.3f},\"seconds\":{:.1f}}}",
      ranks, tensors, g.tp, g.pp, g.dp, split_min, stage.size(), by_owner.size(), parts, mean / 1e6,
      most / 1e6, least / 1e6, most / mean,
      std::chrono::duration<double>(clock::now() - t0).count());
}

}  // namespace cairn_bench
