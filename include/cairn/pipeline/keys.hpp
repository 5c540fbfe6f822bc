// cairn/pipeline/keys.hpp: which leaves a load asks for: ignore globs, the edit callback, key
// mapping, and the strict modes' view of keys the checkpoint lacks or that nobody asks for.
#pragma once

#include <fnmatch.h>

#include <set>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// The key a leaf is known by in the tree (tensor key, object key, common path).
inline const std::string& tree_key(const tensor_leaf& t) { return t.sharding.key; }
inline const std::string& tree_key(const object_leaf& o) { return o.key; }
inline const std::string& tree_key(const common_leaf& c) { return c.path; }

/// Applies ignore globs, the edit callback and key mapping; returns the leaves to load, with
/// checkpoint keys in place of tree keys.
CAIRN_INLINE leaf_list select_leaves(const leaf_list& leaves, const load_options& opt);

/// Drops the leaves whose key the checkpoint does not hold (`saved`), listing them in
/// `stats.unexpected`; returns every key the leaves asked for before that.
CAIRN_INLINE std::set<std::string> drop_unexpected(leaf_list& leaves,
                                                   const std::set<std::string>& saved,
                                                   load_stats& stats);

/// Whether a strict mode also looks for missing keys (checkpoint keys no rank asks for).
inline bool wants_missing(strict_mode s) {
  return s == strict_mode::log_all || s == strict_mode::raise_all || s == strict_mode::return_all;
}

/// Logs or fails as the strict mode says, from `stats.unexpected` and `stats.missing`.
CAIRN_INLINE result<void> report_strict(const load_options& opt, int rank, const load_stats& stats);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/keys-inl.hpp"
#endif
