// bench/plan_roles.hpp: `cairn-bench --plan --scalable`: what each role of scalable save
// planning (include/cairn/plan/scalable.hpp) costs at scale, simulated in one process with
// metadata only.
//
// The grid is plan_sweep.hpp's (TP = 8, PP stages, DP replicas; T [4096, 4096] bf16 weights with
// two f32 Adam moments each, the moments in distributed-optimizer flat slices). Roles:
// - every rank: describe its leaves and split them by owner (`claims_by_owner`); measured on
//   rank 0 (all ranks of a grid hold the same number of leaves).
// - owner: receive every rank's claims for its keys and plan them (`plan_owned`); measured on
//   `--owners` owners (rank 0, the owner of the most keys, random others), reporting the largest.
// - writer: receive its slots from the owners of its keys; measured exactly for rank 0 by
//   planning each of its keys as its owner would.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cairn/format/native/index_file.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/plan/scalable.hpp"
#include "plan_sweep.hpp"

namespace cairn_bench {

/// What one role cost.
struct role_cost {
  double ms = 0;
  std::size_t sent = 0, received = 0;
};

/// The claims every rank sends the owner of `keys` (weight, kind).
inline std::vector<cairn::bytes> claims_for_owner(const grid& g,
                                                  const std::vector<std::pair<int, int>>& keys) {
  std::map<int, cairn::rank_desc> part;
  for (auto [t, kind] : keys)
    for (int r : g.ranks_of_stage(g.stage(t))) part[r].tensors.push_back(g.leaf(r, t, kind));
  std::vector<cairn::bytes> in(static_cast<std::size_t>(g.ranks));
  for (const auto& [r, d] : part) {
    std::vector<std::uint64_t> leaf(d.tensors.size());
    for (std::size_t i = 0; i < leaf.size(); ++i) leaf[i] = i;
    in[static_cast<std::size_t>(r)] = cairn::encode_claims(d, leaf, {});
  }
  return in;
}

/// Plans as owner: returns the role's cost and the bytes it sends each writer.
inline role_cost owner_role(const std::vector<cairn::bytes>& in, std::vector<std::size_t>* to) {
  role_cost c;
  for (const auto& b : in) c.received += b.size();
  auto t0 = std::chrono::steady_clock::now();
  auto plan = cairn::plan_owned(in, true, cairn::default_block_size,
                                cairn::save_options{}.balance_min_bytes, true);
  c.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!plan) throw std::runtime_error("plan_owned: " + plan.err().describe());
  for (std::size_t r = 0; r < plan->to_writer.size(); ++r) {
    c.sent += plan->to_writer[r].size();
    if (to) (*to)[r] += plan->to_writer[r].size();
  }
  return c;
}

/// The roles of scalable planning for `ranks` × `tensors` with `pp` stages, as JSON.
inline std::string simulate_roles(int ranks, int tensors, int pp, int owners) {
  grid g = make_grid(ranks, tensors, pp);
  // Every rank: describe and split by owner (rank 0).
  role_cost every;
  auto t0 = std::chrono::steady_clock::now();
  cairn::rank_desc me = g.leaves_of(0);
  auto out = cairn::claims_by_owner(me, ranks);
  every.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& b : out) every.sent += b.size();
  // Owners: sampled, rank 0 among them.
  std::vector<std::vector<std::pair<int, int>>> owned(static_cast<std::size_t>(ranks));
  for (int t = 0; t < tensors; ++t)
    for (int kind = 0; kind < 3; ++kind)
      owned[static_cast<std::size_t>(cairn::owner_of(grid::key(t, kind), ranks))].push_back(
          {t, kind});
  std::size_t most_keys = 0;
  for (const auto& k : owned) most_keys = std::max(most_keys, k.size());
  std::mt19937 rng(7);
  role_cost owner;
  // Rank 0, the owner of the most keys, and random others.
  int busiest = 0;
  for (int o = 0; o < ranks; ++o)
    if (owned[static_cast<std::size_t>(o)].size() == most_keys) busiest = o;
  std::vector<int> sample{0, busiest};
  for (int i = 2; i < owners && i < ranks; ++i) sample.push_back(static_cast<int>(rng() % ranks));
  for (int o : sample) {
    role_cost c = owner_role(claims_for_owner(g, owned[static_cast<std::size_t>(o)]), nullptr);
    if (c.ms > owner.ms) owner.ms = c.ms;
    owner.sent = std::max(owner.sent, c.sent);
    owner.received = std::max(owner.received, c.received);
  }
  // The busiest owner at the commit (format version 5's route step): every writer of its keys
  // sends it one index section per key with the chunks it wrote.
  std::uint64_t route_received = 0;
  {
    auto plan = cairn::plan_owned(claims_for_owner(g, owned[static_cast<std::size_t>(busiest)]),
                                  false, cairn::default_block_size,
                                  cairn::save_options{}.balance_min_bytes, cairn::index_slabs);
    if (!plan) throw std::runtime_error("plan_owned: " + plan.err().describe());
    std::map<std::uint32_t, cairn::detail::routed_sections> by_writer;
    for (const auto& [key, t] : plan->index.tensors) {
      std::map<std::uint32_t, cairn::tensor_record> parts;
      for (cairn::chunk_record c : t.chunks) {
        c.where.checksums.assign(cairn::detail::chunk_blocks(c, cairn::default_block_size), 0x5eed);
        auto [at, fresh] =
            parts.try_emplace(c.where.file, cairn::tensor_record{t.type, t.global_shape, {}});
        at->second.chunks.push_back(std::move(c));
      }
      for (const auto& [writer, part] : parts) {
        cairn::bytes section;
        cairn::append_index_section(section, key, part);
        by_writer[writer].sections.push_back(std::move(section));
      }
    }
    for (const auto& [writer, m] : by_writer)
      if (static_cast<int>(writer) != busiest)
        route_received += cairn::detail::encode_message(m).size();
  }
  // Writer: rank 0's slots from the owners of its keys, planned key by key (at most 300 keys,
  // evenly spaced, scaled up to all of them).
  std::vector<std::size_t> to(static_cast<std::size_t>(ranks), 0);
  const std::size_t step = std::max<std::size_t>(1, me.tensors.size() / 300);
  std::size_t sampled = 0;
  for (std::size_t i = 0; i < me.tensors.size(); i += step, ++sampled) {
    owner_role(claims_for_owner(g, {grid::parse_key(me.tensors[i].key)}), &to);
  }
  role_cost writer;
  writer.received = to[0] * me.tensors.size() / std::max<std::size_t>(sampled, 1);
  return fmt::format(
      "{{\"ranks\":{},\"tensors\":{},\"tp\":{},\"pp\":{},\"dp\":{},\"leaves_per_rank\":{},"
      "\"keys_per_owner_max\":{},\"every_rank\":{{\"ms\":{:.1f},\"sent\":{}}},"
      "\"owner_max_of_{}\":{{\"ms\":{:.1f},\"received\":{},\"sent\":{}}},"
      "\"writer_rank0\":{{\"received\":{},\"keys_sampled\":{}}},"
      "\"received_max_estimate\":{},\"busiest_owner_at_commit\":{{\"received\":{}}},"
      "\"peak_rss_mb\":{:.1f}}}",
      ranks, tensors, g.tp, g.pp, g.dp, me.tensors.size(), most_keys, every.ms, every.sent,
      sample.size(), owner.ms, owner.received, owner.sent, writer.received, sampled,
      owner.received + writer.received, route_received, peak_rss_mb());
}

}  // namespace cairn_bench
