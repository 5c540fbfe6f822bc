// cairn/pipeline/scalable_plan.hpp: the collective of scalable save planning (the pure parts are
// plan/scalable.hpp): statuses and rank 0's save id and common values meet first, then claims go
// to key owners and slots back to writers (two all_to_alls), then statuses meet again.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/plan/scalable.hpp"

namespace cairn {

namespace detail {

/// What each rank sends rank 0 before scalable planning: its structure hash and its common
/// values (paths and hashes; rank 0 checks that the ranks declaring one agree).
struct planning_start_message {
  static constexpr std::string_view message_name = "planning start (rank)";
  std::uint64_t structure = 0;
  std::vector<common_desc> commons;
};

/// What rank 0 tells every rank before scalable planning: whether a checkpoint is there, its
/// save id, and the common values held by a group of ranks with the rank that sends each
/// (`save_index::common_holders`).
struct root_said_message {
  static constexpr std::string_view message_name = "planning start";
  bool checkpoint_exists = false;
  std::string save_id;
  std::map<std::string, int> common_holders;
};

}  // namespace detail

/// What scalable planning agreed on, as this rank sees it.
struct scalable_agreement {
  save_index index;             ///< this rank's index (`writer_index`)
  std::string save_id;          ///< rank 0's save id
  bool exists_at_root = false;  ///< rank 0 found a committed checkpoint
  /// On rank 0, every rank's `structure` argument (for the plan cache's vote); empty elsewhere.
  std::vector<std::uint64_t> structure_of_rank;
};

/// Collective: plans a save with every rank's description `me` (or its local failure), the
/// scalable way (see the top of this header). Fails on every rank alike, with the lowest
/// failing rank's error.
CAIRN_INLINE result<scalable_agreement> scalable_plan(const rank_desc& me,
                                                      const std::optional<error>& failure,
                                                      comm_ref comm,
                                                      bool validate,
                                                      std::uint64_t block_size,
                                                      std::uint64_t split_min_bytes,
                                                      tiling tile,
                                                      std::uint64_t structure = 0);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/scalable_plan-inl.hpp"
#endif
