// cairn/plan/cover.hpp: whether a set of boxes tiles a target box exactly (pairwise disjoint,
// nothing missing). Load checks the chunks it reads with it, so that a checkpoint whose chunks
// overlap or leave a gap (hand-edited, corrupted, or saved without access-integrity validation)
// is an error, never a target left partly unwritten.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

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
inline std::optional<std::pair<std::size_t, std::size_t>> find_overlap(std::span<const box> boxes,
                                                                       std::vector<std::size_t> idx,
                                                                       std::size_t axis) {
  if (idx.size() < 2) return std::nullopt;
  const std::size_t d = boxes[idx.front()].size.size();
  auto lo = [&](std::size_t i, std::size_t a) { return boxes[i].offset[a]; };
  auto hi = [&](std::size_t i, std::size_t a) { return boxes[i].offset[a] + boxes[i].size[a]; };
  if (axis + 1 == d) {  // intervals on one axis: sorted, each must end before the next starts
    std::sort(idx.begin(), idx.end(),
              [&](std::size_t a, std::size_t b) { return lo(a, axis) < lo(b, axis); });
    std::size_t reach = idx[0];  // the box reaching furthest so far
    for (std::size_t k = 1; k < idx.size(); ++k) {
      if (lo(idx[k], axis) < hi(reach, axis)) return std::pair{reach, idx[k]};
      if (hi(idx[k], axis) > hi(reach, axis)) reach = idx[k];
    }
    return std::nullopt;
  }
  // Events along `axis`: ends before starts at the same coordinate (touching is not overlap).
  struct event {
    std::int64_t at;
    bool start;
    std::size_t box;
  };
  std::vector<event> ev;
  ev.reserve(idx.size() * 2);
  for (std::size_t i : idx) {
    ev.push_back({lo(i, axis), true, i});
    ev.push_back({hi(i, axis), false, i});
  }
  std::sort(ev.begin(), ev.end(), [](const event& a, const event& b) {
    return a.at != b.at ? a.at < b.at : (!a.start && b.start);
  });
  if (axis + 2 == d) {
    // Boxes present at one coordinate of `axis` must be disjoint on the last axis: keep their
    // intervals there in a map by start, check each new one against its neighbours.
    const std::size_t last = axis + 1;
    std::map<std::int64_t, std::size_t> active;
    for (const event& e : ev) {
      if (!e.start) {
        auto it = active.find(lo(e.box, last));
        if (it != active.end() && it->second == e.box) active.erase(it);
        continue;
      }
      const std::int64_t s = lo(e.box, last), t = hi(e.box, last);
      auto next = active.lower_bound(s);
      if (next != active.end() && next->first < t) return std::pair{next->second, e.box};
      if (next != active.begin() && hi(std::prev(next)->second, last) > s)
        return std::pair{std::prev(next)->second, e.box};
      active.emplace(s, e.box);
    }
    return std::nullopt;
  }
  // More axes: every stretch of `axis` between consecutive coordinates holds a fixed set of
  // boxes; check each distinct set on the remaining axes.
  std::vector<std::size_t> active;
  bool changed = false;
  for (std::size_t k = 0; k < ev.size();) {
    const std::int64_t at = ev[k].at;
    for (; k < ev.size() && ev[k].at == at; ++k) {
      if (ev[k].start)
        active.push_back(ev[k].box);
      else
        std::erase(active, ev[k].box);
      changed = true;
    }
    if (changed && active.size() > 1 && k < ev.size()) {
      if (auto o = find_overlap(boxes, active, axis + 1)) return o;
      changed = false;
    }
  }
  return std::nullopt;
}

/// A box of `target` that none of `boxes[idx]` meets, or nullopt when they cover it (or the
/// search took more than `budget` box comparisons). Depth first: a piece is split around the
/// first box that meets it (into at most two slabs per axis), and its slabs need only be
/// compared with the boxes after that one (the earlier ones missed the whole piece).
inline std::optional<box> find_uncovered(std::span<const box> boxes,
                                         const std::vector<std::size_t>& idx,
                                         const box& target,
                                         std::size_t budget) {
  struct piece {
    box region;
    std::size_t from;  ///< the first position of `idx` that may meet it
  };
  std::vector<piece> todo{{target, 0}};
  while (!todo.empty()) {
    piece p = std::move(todo.back());
    todo.pop_back();
    std::size_t k = p.from;
    std::optional<box> x;
    for (; k < idx.size(); ++k) {
      if (budget-- == 0) return std::nullopt;
      if ((x = intersect(p.region, boxes[idx[k]]))) break;
    }
    if (k == idx.size()) return p.region;  // no box meets this piece
    // p minus x: for each axis, the slabs below and above x, with earlier axes cut to x.
    box rest = p.region;
    for (std::size_t a = 0; a < rest.size.size(); ++a) {
      const std::int64_t lo = rest.offset[a], hi = lo + rest.size[a];
      const std::int64_t xlo = x->offset[a], xhi = xlo + x->size[a];
      if (xlo > lo) {
        box below = rest;
        below.size[a] = xlo - lo;
        todo.push_back({std::move(below), k + 1});
      }
      if (xhi < hi) {
        box above = rest;
        above.offset[a] = xhi;
        above.size[a] = hi - xhi;
        todo.push_back({std::move(above), k + 1});
      }
      rest.offset[a] = xlo;
      rest.size[a] = xhi - xlo;
    }
  }
  return std::nullopt;
}

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
inline std::optional<cover_problem> check_exact_cover(std::span<const box> boxes,
                                                      const box& target) {
  const std::int64_t wanted = target.volume();
  if (target.size.empty()) {  // a scalar
    if (boxes.size() > 1) return cover_problem{cover_problem::kind::overlap, 0, 1, target, 0, 1};
    if (boxes.size() == 1) return std::nullopt;
    cover_problem p{cover_problem::kind::gap, 0, 0, {}, 0, 1};
    p.missing = target;
    return p;
  }
  std::vector<std::size_t> idx;
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    std::int64_t v = boxes[i].volume();
    if (v == 0) continue;
    idx.push_back(i);
    covered += v;  // each box lies inside the target, so no overflow until the sum passes it
    if (covered > wanted) break;  // some must overlap; find_overlap names them
  }
  if (auto o = detail::find_overlap(boxes, idx, 0)) {
    cover_problem p{cover_problem::kind::overlap, o->first, o->second, {}, 0, wanted};
    p.shared = intersect(boxes[o->first], boxes[o->second]).value_or(box{});
    return p;
  }
  if (covered != wanted) {
    cover_problem p{cover_problem::kind::gap, 0, 0, {}, covered, wanted};
    p.missing = detail::find_uncovered(boxes, idx, target, uncovered_search_budget);
    return p;
  }
  return std::nullopt;
}

}  // namespace cairn
