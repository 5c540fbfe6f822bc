// bench/plan_real.hpp: save planning run for real over a communicator, by key owners or by
// an all-gather, with every rank's wall time and bytes sent and received counted by a wrapper
// around the communicator. Used by `cairn-bench --plan --real` (thread ranks) and
// `cairn-bench-plan-mpi` (MPI processes).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/pipeline/save.hpp"
#include "cairn/pipeline/scalable_plan.hpp"
#include "cairn/storage/memory.hpp"
#include "plan_roles.hpp"

namespace cairn_bench {

/// Counts the bytes a rank sends and receives through any communicator.
struct counted_comm {
  cairn::comm_ref inner;
  std::uint64_t sent = 0, received = 0;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  static std::uint64_t total(const std::vector<cairn::bytes>& v) {
    std::uint64_t n = 0;
    for (const auto& b : v) n += b.size();
    return n;
  }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
    auto out = inner.all_gather(in);
    sent += in.size() * static_cast<std::uint64_t>(size() - 1);
    received += total(out) - in.size();
    return out;
  }
  std::vector<cairn::bytes> gather(std::span<const std::byte> in, int root) {
    auto out = inner.gather(in, root);
    if (rank() != root) sent += in.size();
    if (rank() == root) received += total(out) - in.size();
    return out;
  }
  std::vector<cairn::bytes> all_to_all(const std::vector<cairn::bytes>& to) {
    auto out = inner.all_to_all(to);
    auto me = static_cast<std::size_t>(rank());
    sent += total(to) - to[me].size();
    received += total(out) - out[me].size();
    return out;
  }
  void broadcast(cairn::bytes& b, int root) {
    std::size_t before = b.size();
    inner.broadcast(b, root);
    if (rank() == root) sent += before * static_cast<std::uint64_t>(size() - 1);
    if (rank() != root) received += b.size();
  }
  void barrier() { inner.barrier(); }
};

/// One rank's figures from a real planning run.
struct real_rank {
  double ms = 0;
  std::uint64_t sent = 0, received = 0;
};

/// Plans this rank's leaves of grid `g` over `comm` as a save does (validation on): by key
/// owners (`plan_at_scale`), or with `everywhere` by an all-gather of every rank's description
/// (`plan_everywhere`); returns its figures.
inline real_rank plan_for_real(cairn::comm_ref comm, const grid& g, bool everywhere = false) {
  cairn::rank_desc me = g.leaves_of(comm.rank());
  counted_comm counted{comm};
  cairn::comm_ref c(counted);
  cairn::memory_storage st;  // named in errors only
  cairn::save_options so;
  so.scalable_planning = !everywhere;
  cairn::save_stats stats;
  c.barrier();
  auto t0 = std::chrono::steady_clock::now();
  auto plan = everywhere ? cairn::detail::plan_everywhere(me, std::nullopt, st, c, so, stats)
                         : cairn::detail::plan_at_scale(me, std::nullopt, st, c, so, stats);
  real_rank r;
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!plan) throw std::runtime_error("planning: " + plan.err().describe());
  r.sent = counted.sent;
  r.received = counted.received;
  return r;
}

/// Every rank's figures as JSON: max and mean of time, sent and received (rank 0 apart).
inline std::string real_json(const grid& g, const std::vector<real_rank>& all, const char* how) {
  real_rank mx, mean;
  for (std::size_t r = 1; r < all.size(); ++r) {
    mx.ms = std::max(mx.ms, all[r].ms);
    mx.sent = std::max(mx.sent, all[r].sent);
    mx.received = std::max(mx.received, all[r].received);
    mean.ms += all[r].ms / static_cast<double>(all.size() - 1);
    mean.sent += all[r].sent / (all.size() - 1);
    mean.received += all[r].received / (all.size() - 1);
  }
  return fmt::format(
      "{{\"bench\":\"cairn-plan-real\",\"ranks\":{},\"how\":\"{}\",\"tensors\":{},\"tp\":{},"
      "\"pp\":{},\"dp\":{},\"leaves_per_rank\":{},\"rank0\":{{\"ms\":{:.1f},\"sent\":{},"
      "\"received\":{}}},\"others_max\":{{\"ms\":{:.1f},\"sent\":{},\"received\":{}}},"
      "\"others_mean\":{{\"ms\":{:.1f},\"sent\":{},\"received\":{}}}}}",
      g.ranks, how, g.tensors, g.tp, g.pp, g.dp, 3 * ((g.tensors + g.pp - 1) / g.pp), all[0].ms,
      all[0].sent, all[0].received, mx.ms, mx.sent, mx.received, mean.ms, mean.sent, mean.received);
}

/// One rank's figures as they travel over a communicator.
struct real_rank_message {
  static constexpr std::string_view message_name = "bench figures";
  std::uint64_t micros = 0, sent = 0, received = 0;
};

/// Encodes / decodes one rank's figures (for gathering them over a communicator).
inline cairn::bytes encode_real(const real_rank& r) {
  return cairn::detail::encode_message(
      real_rank_message{static_cast<std::uint64_t>(r.ms * 1000), r.sent, r.received});
}
inline real_rank decode_real(std::span<const std::byte> b) {
  const real_rank_message m = cairn::detail::decode_message<real_rank_message>(b).value();
  real_rank r;
  r.ms = static_cast<double>(m.micros) / 1000;
  r.sent = m.sent;
  r.received = m.received;
  return r;
}

}  // namespace cairn_bench
