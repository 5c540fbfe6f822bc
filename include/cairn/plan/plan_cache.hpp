// cairn/plan/plan_cache.hpp: the save plan cache. A save whose structure did not change on any
// rank reuses the previous plan: ranks exchange a hash instead of their descriptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn {

namespace detail {
struct plan_cache_access;
}  // namespace detail

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
  std::uint64_t block_size_ = 0, balance_min_bytes_ = 0;
  bool tile_ = true;
  bool scalable_ = false;
  bool index_files_ = false;
  const void* strategy_ = nullptr;
  bool validated_ = false;
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
  static bool usable(const save_plan_cache& c, int world, const save_options& o);
  static const std::vector<std::uint64_t>& structure(const save_plan_cache& c) {
    return c.structure_;
  }
  static save_index hit(save_plan_cache& c);
  static void store(save_plan_cache& c,
                    int world,
                    const save_options& o,
                    std::vector<std::uint64_t> structure,
                    const save_index& index);
};

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/plan_cache-inl.hpp"
#endif
