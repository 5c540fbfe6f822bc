// cairn/plan/plan_cache.hpp: the save plan cache. A save whose structure did not change on any
// rank reuses the previous plan: ranks exchange a hash instead of their descriptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn {

namespace detail {
struct plan_cache_access;
}  // namespace detail

/// What a plan depends on besides the ranks' structure: the settings it was made with. A cached
/// plan is reused only under the same settings.
struct plan_settings {
  std::uint64_t block_size = 0;
  std::uint64_t balance_min_bytes = 0;
  bool tile = true;
  bool scalable = false;
  bool index_files = false;
  const void* strategy = nullptr;  ///< the save strategy (its identity)
  bool validated = false;          ///< the plan's access integrity was checked

  /// Whether a plan made under these settings serves a save under `want`: the same settings,
  /// and validated if `want` asks for validation.
  bool serves(const plan_settings& want) const noexcept {
    return block_size == want.block_size && balance_min_bytes == want.balance_min_bytes &&
           tile == want.tile && scalable == want.scalable && index_files == want.index_files &&
           strategy == want.strategy && (validated || !want.validated);
  }
};

/// Remembers the plan of the last save made with it. A later save whose tree structure and
/// sharding are unchanged on every rank reuses the plan: the ranks exchange a few bytes (a
/// hash of their structure and of their common values) instead of every leaf's description,
/// and skip planning and validation. Use one cache per checkpoint series (not shared between
/// communicators); it is not thread-safe.
class save_plan_cache {
 public:
  /// Saves that reused the cached plan.
  std::size_t hits() const noexcept { return hits_; }
  /// Saves that had to plan from scratch.
  std::size_t misses() const noexcept { return misses_; }
  /// Forgets the plan.
  void clear() noexcept { valid_ = false; }

 private:
  friend struct detail::plan_cache_access;
  bool valid_ = false;
  int world_ = 0;
  plan_settings settings_;
  std::vector<std::uint64_t> structure_;  // per rank (on rank 0; the vote is decided there)
  save_index index_;
  std::size_t hits_ = 0, misses_ = 0;
};

namespace detail {

/// A hash of what a rank's description says about structure and sharding (not its status,
/// save id or common values).
CAIRN_INLINE std::uint64_t structure_hash(const rank_desc& d);

/// save_leaves' access to save_plan_cache.
struct plan_cache_access {
  static bool usable(const save_plan_cache& c, int world, const plan_settings& want);
  static const std::vector<std::uint64_t>& structure(const save_plan_cache& c) {
    return c.structure_;
  }
  /// The cached plan, without counting a hit.
  static const save_index& cached(const save_plan_cache& c) { return c.index_; }
  static save_index hit(save_plan_cache& c);
  static void store(save_plan_cache& c,
                    int world,
                    const plan_settings& made_with,
                    std::vector<std::uint64_t> structure,
                    const save_index& index);
};

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/plan_cache-inl.hpp"
#endif
