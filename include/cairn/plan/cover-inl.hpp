// cairn/plan/cover-inl.hpp: the bodies of cairn/plan/cover.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <iterator>
#include <map>

#include "cairn/plan/cover.hpp"

namespace cairn::detail {

CAIRN_INLINE std::optional<std::pair<std::size_t, std::size_t>> find_overlap(
    std::span<const box> boxes, std::vector<std::size_t> idx, std::size_t axis) {
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

CAIRN_INLINE std::optional<box> find_uncovered(std::span<const box> boxes,
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

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE std::optional<cover_problem> check_exact_cover(std::span<const box> boxes,
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
