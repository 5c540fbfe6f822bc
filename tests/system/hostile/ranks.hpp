// tests/system/hostile/ranks.hpp: a hostile checkpoint loaded on several thread ranks at once, each
// rank asking for its own piece of a tensor — inside the damaged region, across its edges,
// outside it, the whole tensor, rows split over the ranks — so that the paths that depend on
// which part of a tensor a rank asks for are reached (a rank whose piece lies in a gap, one
// that meets no chunk at all, ranks that fail while others succeed). Each layout runs in a
// forked child under bounds (tests/system/hostile/bounded.hpp) and must end cleanly on every rank:
// the same cairn error everywhere, or success everywhere.
//
//   cairn_hostile::tensor_claim w{"w", cairn::dtype::f32, {4}, cairn::box{{2}, {2}}};
//   for (const auto& run : cairn_hostile::load_on_ranks(mem, w, {2, 3}))
//     CHECK_MESSAGE(run.clean(), run.describe());
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/foreign.hpp"
#include "tests/system/hostile/bounded.hpp"

namespace cairn_hostile {

/// A tensor of a hostile checkpoint as the loading ranks declare it (what the checkpoint
/// claims), and the region its damage touches (the whole tensor when not given).
struct tensor_claim {
  std::string key;
  cairn::dtype type = cairn::dtype::f32;
  cairn::shape shape;
  std::optional<cairn::box> damaged;
};

/// The piece each rank loads in one run.
struct rank_layout {
  std::string name;
  std::vector<cairn::box> pieces;  ///< one per rank
};

/// One bounded multi-rank load and how it ended.
struct rank_run {
  rank_layout layout;
  bool touches_damage = false;  ///< some rank's piece meets the damaged region
  report ended;                 ///< how the load ended (the same on every rank)

  /// True when every rank ended in the same cairn error, or every rank succeeded.
  bool clean() const noexcept {
    return ended.what == outcome::clear_error || ended.what == outcome::succeeded;
  }
  /// One line for a test message: the layout, each rank's piece, the outcome.
  std::string describe() const {
    std::string s = std::to_string(layout.pieces.size()) + " ranks, " + layout.name + " (";
    for (std::size_t r = 0; r < layout.pieces.size(); ++r)
      s +=
          (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " " + layout.pieces[r].str();
    return s + "): " + ended.describe();
  }
};

namespace detail {

/// Largest extent of a piece along one axis: pieces stay small however large the claim.
inline constexpr std::int64_t piece_cap = 8;

/// The box at `offset` (clamped into `shape`) of at most `size` elements per axis, inside
/// `shape`. A tensor with an empty axis gets the empty box at the origin.
inline cairn::box piece_at(const cairn::shape& shape, cairn::shape offset, cairn::shape size) {
  cairn::box b{cairn::shape(shape.size(), 0), cairn::shape(shape.size(), 0)};
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d <= 0; })) return b;
  for (std::size_t a = 0; a < shape.size(); ++a) {
    b.offset[a] = std::clamp<std::int64_t>(offset[a], 0, shape[a] - 1);
    b.size[a] = std::clamp<std::int64_t>(size[a], 1, std::min(piece_cap, shape[a] - b.offset[a]));
  }
  return b;
}

/// Whether `b` holds an element (without multiplying claimed sizes, which may overflow).
inline bool nonempty(const cairn::box& b) {
  return std::all_of(b.size.begin(), b.size.end(), [](std::int64_t n) { return n > 0; });
}

/// Whether a tensor of `shape` has at most 4096 elements.
inline bool small(const cairn::shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || d > 4096 || (n *= std::max<std::int64_t>(d, 1)) > 4096) return false;
  }
  return true;
}

}  // namespace detail

/// The layouts `world` ranks load `t` in: the candidate pieces (inside the damage, across its
/// start and its end on axis 0, outside it, the whole tensor when it is small) dealt to the
/// ranks in every rotation, and the rows of a small tensor split over the ranks.
inline std::vector<rank_layout> layouts(const tensor_claim& t, int world) {
  const cairn::shape& s = t.shape;
  const std::size_t nd = s.size();
  cairn::box d = t.damaged.value_or(cairn::box{cairn::shape(nd, 0), s});
  std::vector<std::pair<std::string, cairn::box>> cands;
  if (nd == 0) {
    cands.push_back({"the scalar", cairn::box{}});
  } else {
    const cairn::shape ones(nd, 1);
    auto shifted = [&](std::int64_t at0, std::int64_t len0) {
      cairn::shape off = d.offset, size = d.size;
      off[0] = at0;
      size[0] = len0;
      return detail::piece_at(s, off, size);
    };
    const std::int64_t end0 = d.offset[0] + d.size[0];
    cands.push_back({"inside", detail::piece_at(s, d.offset, d.size)});
    if (d.offset[0] > 0) cands.push_back({"across its start", shifted(d.offset[0] - 2, 4)});
    if (end0 < s[0]) cands.push_back({"across its end", shifted(end0 - 2, 4)});
    if (d.offset[0] > 0)
      cands.push_back({"before it", shifted(0, d.offset[0])});
    else if (end0 < s[0])
      cands.push_back({"after it", shifted(end0, s[0] - end0)});
    cands.push_back({"the last element", detail::piece_at(
                                             s,
                                             [&] {
                                               cairn::shape last = s;
                                               for (auto& x : last) x -= 1;
                                               return last;
                                             }(),
                                             ones)});
    if (detail::small(s)) cands.push_back({"the whole tensor", {cairn::shape(nd, 0), s}});
  }
  std::vector<rank_layout> out;
  auto add = [&](rank_layout l) {
    for (const auto& o : out)
      if (o.pieces == l.pieces) return;
    out.push_back(std::move(l));
  };
  for (std::size_t k = 0; k < cands.size(); ++k) {
    rank_layout l;
    for (int r = 0; r < world; ++r) {
      const auto& c = cands[(static_cast<std::size_t>(r) + k) % cands.size()];
      l.name += (r ? ", " : "") + c.first;
      l.pieces.push_back(c.second);
    }
    add(std::move(l));
  }
  if (nd > 0 && detail::small(s)) {
    rank_layout l{"rows split over the ranks", {}};
    for (int r = 0; r < world; ++r) {
      cairn::box b{cairn::shape(nd, 0), s};
      b.offset[0] = s[0] * r / world;
      b.size[0] = s[0] * (r + 1) / world - b.offset[0];
      l.pieces.push_back(b);
    }
    add(std::move(l));
  }
  return out;
}

/// Loads piece `layout.pieces[rank]` of `t` from `st` on one thread rank per piece (in this
/// process). Every rank must end the same way: returns the one error they all report, or ok.
/// Ranks that disagree (some succeed, some fail, or their errors differ) throw
/// std::logic_error, which `run_bounded` reports as a non-cairn exception.
inline cairn::result<void> load_pieces(cairn::storage_ref st,
                                       const tensor_claim& t,
                                       const rank_layout& layout,
                                       const cairn::load_options& opt = {}) {
  const int world = static_cast<int>(layout.pieces.size());
  std::vector<std::optional<cairn::error>> errors(layout.pieces.size());
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    const cairn::box& piece = layout.pieces[static_cast<std::size_t>(comm.rank())];
    std::vector<std::byte> buf(static_cast<std::size_t>(piece.volume()) *
                               cairn::dtype_size(t.type));
    cairn::sharded_tensor<> leaf;
    leaf.key = t.key;
    leaf.type = t.type;
    leaf.local_shape = piece.size;
    leaf.global_shape = t.shape;
    leaf.global_offset = piece.offset;
    leaf.data = buf;
    cairn::state_dict sd;
    sd.add(t.key, leaf);
    auto r = cairn::try_load(sd, st, comm, opt);
    if (!r) errors[static_cast<std::size_t>(comm.rank())] = r.err();
  });
  for (std::size_t r = 1; r < errors.size(); ++r)
    if (errors[r].has_value() != errors[0].has_value() ||
        (errors[r] && errors[r]->describe() != errors[0]->describe()))
      throw std::logic_error("the ranks disagree: rank 0 " +
                             (errors[0] ? "failed: " + errors[0]->describe() : "succeeded") +
                             ", rank " + std::to_string(r) + " " +
                             (errors[r] ? "failed: " + errors[r]->describe() : "succeeded"));
  if (errors[0]) return *errors[0];
  return cairn::ok();
}

/// Loads `t` from `st` on every world size of `worlds`, in every layout of `layouts` (the first
/// `max_layouts` of each world), each in a bounded child; returns how each ended.
inline std::vector<rank_run> load_on_ranks(cairn::storage_ref st,
                                           const tensor_claim& t,
                                           std::vector<int> worlds = {2, 3},
                                           const cairn::load_options& opt = {},
                                           const bounds& b = {},
                                           std::size_t max_layouts = SIZE_MAX) {
  std::vector<rank_run> runs;
  for (int world : worlds) {
    std::vector<rank_layout> ls = layouts(t, world);
    if (ls.size() > max_layouts) ls.resize(max_layouts);
    for (rank_layout& l : ls) {
      rank_run run;
      run.layout = std::move(l);
      const std::size_t nd = t.shape.size();
      const cairn::box d = t.damaged.value_or(cairn::box{cairn::shape(nd, 0), t.shape});
      for (const auto& p : run.layout.pieces)
        run.touches_damage = run.touches_damage || nd == 0 ||
                             (detail::nonempty(p) && detail::nonempty(d) && cairn::intersect(p, d));
      run.ended = run_bounded([&] { return load_pieces(st, t, run.layout, opt); }, b);
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

}  // namespace cairn_hostile
