// cairn/pipeline/scalable_plan-inl.hpp: the bodies of cairn/pipeline/scalable_plan.hpp (included by
// it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <map>
#include <utility>

#include "cairn/comm/agree.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/pipeline/scalable_plan.hpp"

namespace cairn {

CAIRN_INLINE result<scalable_agreement> scalable_plan(const rank_desc& me,
                                                      const std::optional<error>& failure,
                                                      comm_ref comm,
                                                      bool validate,
                                                      std::uint64_t block_size,
                                                      std::uint64_t split_min_bytes,
                                                      tiling tile,
                                                      std::uint64_t structure) {
  const int world = comm.size(), rank = comm.rank();
  // 1. Statuses, structure hashes and common values meet at rank 0, which checks that the
  //    ranks declaring a common value agree and sends back its save id, whether a checkpoint
  //    exists and which rank holds each group-held common value.
  scalable_agreement out;
  const bytes start = detail::encode_message(detail::planning_start_message{structure, me.commons});
  auto [started, root_said] = agree_at_root(comm, 0, failure, start, [&](const auto& p) {
    std::vector<std::vector<common_desc>> commons;
    for (std::size_t r = 0; r < p.size(); ++r) {
      result<detail::planning_start_message> m =
          detail::decode_message<detail::planning_start_message>(p[r]);
      if (!m)
        return std::pair{std::optional<error>(std::move(m).err().with_rank(static_cast<int>(r))),
                         bytes{}};
      out.structure_of_rank.push_back(m->structure);
      commons.push_back(std::move(m->commons));
    }
    result<std::map<std::string, int>> holders = detail::common_holders(commons, validate);
    if (!holders) return std::pair{std::optional<error>(std::move(holders).err()), bytes{}};
    return std::pair{std::optional<error>{},
                     detail::encode_message(detail::root_said_message{
                         me.checkpoint_exists, me.save_id, std::move(*holders)})};
  });
  if (started) return std::move(*started);
  result<detail::root_said_message> said =
      detail::decode_message<detail::root_said_message>(root_said);
  if (!said) return std::move(said).err().with_rank(0);
  out.exists_at_root = said->checkpoint_exists;
  out.save_id = std::move(said->save_id);
  // 2. Claims go to their owners; each owner checks and plans its keys.
  std::optional<error> mine;
  // Nothing below throws between collectives: a failure is carried to the next agreement.
  std::vector<bytes> claims(static_cast<std::size_t>(world));
  auto split = detail::catch_all("splitting claims by owner", [&]() -> result<void> {
    claims = claims_by_owner(me, world);
    return ok();
  });
  if (!split && !mine) mine = std::move(split).err();
  std::vector<bytes> received = comm.all_to_all(claims);
  claims.clear();
  std::vector<bytes> to_writer(static_cast<std::size_t>(world));
  auto owned = detail::catch_all("planning owned keys", [&] {
    return plan_owned(received, validate, block_size, split_min_bytes, tile);
  });
  received.clear();
  if (owned)
    to_writer = std::move(owned->to_writer);
  else if (!mine)
    mine = std::move(owned).err();
  // 3. Each writer receives its slots and builds its index; statuses meet at rank 0 again.
  std::vector<bytes> assigned = comm.all_to_all(to_writer);
  auto index = detail::catch_all("reading this rank's slots", [&]() -> result<save_index> {
    return writer_index(assigned, me, rank, world, block_size, tile);
  });
  if (!index && !mine) mine = std::move(index).err();
  auto [verdict, unused] = agree_at_root(comm, 0, mine, {}, [](const auto&) {
    return std::pair{std::optional<error>{}, bytes{}};
  });
  if (verdict) return std::move(*verdict);
  out.index = std::move(*index);
  out.index.common_holders = std::move(said->common_holders);
  return out;
}

}  // namespace cairn
