// cairn/plan/cover.hpp: whether a set of boxes tiles a target box exactly (pairwise disjoint,
// nothing missing). Load checks the chunks it reads with it, so that a checkpoint whose chunks
// overlap or leave a gap (hand-edited, corrupted, or saved without access-integrity validation)
// is an error, never a target left partly unwritten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/plan/box.hpp"

namespace cairn {

/// Why boxes do not tile a target exactly: two of them overlap, or together they cover less
/// than the target. Only the fields of its kind are set: a gap names no box (there may be none
/// at all), so `first` and `second` are meaningful for an overlap only.
struct cover_problem {
  enum class kind { overlap, gap };
  kind what = kind::gap;
  std::size_t first = 0, second = 0;  ///< overlap: indices of two overlapping boxes
  box shared;                         ///< overlap: the elements both hold
  std::int64_t covered = 0;           ///< gap: elements the boxes cover
  std::int64_t wanted = 0;            ///< gap: elements of the target
  /// gap: a box of the target that no box holds any element of (nullopt when finding one took
  /// more than `uncovered_search_budget` box comparisons).
  std::optional<box> missing;
};

/// How many box comparisons `check_exact_cover` spends at most on naming a missing box.
inline constexpr std::size_t uncovered_search_budget = std::size_t{1} << 20;

namespace detail {

/// An overlapping pair among `boxes[idx]`, comparing axes from `axis` on only (the boxes are
/// known to overlap on every earlier axis). Sweeps `axis`; the last two axes use an ordered
/// map of active intervals (O(n log n)); earlier axes recurse into every stretch of `axis`
/// where the set of boxes present changes (O(n log n) when the boxes form a grid, as every
/// sharding does; a box spanning many stretches is revisited in each).
CAIRN_INLINE std::optional<std::pair<std::size_t, std::size_t>> find_overlap(
    std::span<const box> boxes, std::vector<std::size_t> idx, std::size_t axis);

/// A box of `target` that none of `boxes[idx]` meets, or nullopt when they cover it (or the
/// search took more than `budget` box comparisons). Depth first: a piece is split around the
/// first box that meets it (into at most two slabs per axis), and its slabs need only be
/// compared with the boxes after that one (the earlier ones missed the whole piece).
CAIRN_INLINE std::optional<box> find_uncovered(std::span<const box> boxes,
                                               const std::vector<std::size_t>& idx,
                                               const box& target,
                                               std::size_t budget);

}  // namespace detail

/// Checks that `boxes`, every one inside `target`, are pairwise disjoint and together hold every
/// element of `target`. Returns the first problem found, or nullopt when they tile it exactly.
/// Empty boxes are ignored. For rank-0 (scalar) boxes, exactly one box must be given. A gap
/// comes with a box that no box holds (`missing`), found within a bounded search.
///
/// ```
/// check_exact_cover({{{0}, {2}}, {{1}, {2}}}, {{0}, {4}})  // overlap of boxes 0 and 1 at [1:2]
/// check_exact_cover({{{0}, {2}}}, {{0}, {4}})              // gap: 2 of 4 covered, [2:4] missing
/// ```
CAIRN_INLINE std::optional<cover_problem> check_exact_cover(std::span<const box> boxes,
                                                            const box& target);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/cover-inl.hpp"
#endif
