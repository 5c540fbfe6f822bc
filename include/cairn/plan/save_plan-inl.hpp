// cairn/plan/save_plan-inl.hpp: the bodies of cairn/plan/save_plan.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <optional>

#include "cairn/core/sharded_object.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/plan/cover.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn {

CAIRN_INLINE bytes encode(const rank_desc& d) { return detail::encode_message(d); }

CAIRN_INLINE result<rank_desc> decode_rank_desc(std::span<const std::byte> b) {
  return detail::decode_message<rank_desc>(b, "rank description");
}

CAIRN_INLINE std::uint64_t common_hash(const common_value& v) {
  std::vector<std::byte> b(v.data);
  b.push_back(static_cast<std::byte>(v.kind));
  b.push_back(static_cast<std::byte>(v.type));
  return checksum(b);
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ",...";
  return s;
}

CAIRN_INLINE result<std::map<std::string, integrity_tensor>> collect_integrity_tensors(
    const std::vector<rank_desc>& ranks) {
  std::map<std::string, integrity_tensor> tensors;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (const auto& t : ranks[r].tensors) {
      auto [it, fresh] =
          tensors.try_emplace(t.key, integrity_tensor{t.type, t.global_shape, r, {}});
      integrity_tensor& v = it->second;
      if (!fresh && v.type != t.type)
        return integrity_error(
            t.key, "dtype disagrees across ranks: rank " + std::to_string(v.first_rank) + " has " +
                       std::string(dtype_name(v.type)) + ", rank " + std::to_string(r) + " has " +
                       std::string(dtype_name(t.type)));
      if (!fresh && v.global_shape != t.global_shape)
        return integrity_error(
            t.key, "global shape disagrees across ranks: rank " + std::to_string(v.first_rank) +
                       " has " + box{shape(v.global_shape.size(), 0), v.global_shape}.str() +
                       ", rank " + std::to_string(r) + " has " +
                       box{shape(t.global_shape.size(), 0), t.global_shape}.str());
      for (const auto& p : t.pieces)
        if (p.offset.size() != t.global_shape.size() || p.size.size() != t.global_shape.size())
          return integrity_error(t.key, "rank " + std::to_string(r) + " describes a piece with " +
                                            std::to_string(p.offset.size()) +
                                            " axes of a tensor with " +
                                            std::to_string(t.global_shape.size()));
      if (t.replica_id == 0)
        for (const auto& p : t.pieces) v.pieces.emplace_back(p, r);
    }
  }
  return tensors;
}

CAIRN_INLINE std::size_t most_distinct_axis(const std::vector<std::pair<box, int>>& pieces,
                                            std::size_t n) {
  std::size_t best = 0, best_count = 0;
  for (std::size_t a = 0; a < n; ++a) {
    std::vector<std::int64_t> offs;
    for (const auto& [p, r] : pieces) offs.push_back(p.offset[a]);
    std::sort(offs.begin(), offs.end());
    std::size_t distinct = std::unique(offs.begin(), offs.end()) - offs.begin();
    if (distinct > best_count) best = a, best_count = distinct;
  }
  return best;
}

CAIRN_INLINE result<void> check_no_overlap(const std::string& key, integrity_tensor& v) {
  std::size_t n = v.global_shape.size();
  if (n > 0 && v.pieces.size() > 1) {
    std::size_t best = most_distinct_axis(v.pieces, n);
    std::sort(v.pieces.begin(), v.pieces.end(), [&](const auto& x, const auto& y) {
      return x.first.offset[best] < y.first.offset[best];
    });
    for (std::size_t i = 0; i < v.pieces.size(); ++i) {
      const box& a = v.pieces[i].first;
      for (std::size_t j = i + 1; j < v.pieces.size(); ++j) {
        const box& b = v.pieces[j].first;
        if (b.offset[best] >= a.offset[best] + a.size[best]) break;
        if (auto x = intersect(a, b); x && x->volume() > 0)
          return integrity_error(key, "shards overlap: rank " + std::to_string(v.pieces[i].second) +
                                          " and rank " + std::to_string(v.pieces[j].second) +
                                          " both write " + x->str() +
                                          ": give each rank its own block (cairn::even_block "
                                          "splits an axis over the ranks), or mark every copy "
                                          "but one with replica_id != 0");
      }
    }
  } else if (n == 0 && v.pieces.size() > 1) {
    return integrity_error(key, "shards overlap: ranks " + std::to_string(v.pieces[0].second) +
                                    " and " + std::to_string(v.pieces[1].second) +
                                    " both write the scalar (set replica_id "
                                    "on all but one)");
  }
  return ok();
}

CAIRN_INLINE result<void> check_covered(const std::string& key, const integrity_tensor& v) {
  std::int64_t covered = 0;
  for (const auto& [p, r] : v.pieces) covered += p.volume();
  if (covered != numel(v.global_shape)) {
    std::vector<int> holders;
    std::vector<box> boxes;
    std::vector<std::size_t> idx;
    for (const auto& [p, r] : v.pieces) {
      if (holders.empty() || holders.back() != r) holders.push_back(r);
      if (p.volume() > 0) idx.push_back(boxes.size());
      boxes.push_back(p);
    }
    // The pieces are disjoint (check_no_overlap ran first): name elements nobody writes.
    const box whole{shape(v.global_shape.size(), 0), v.global_shape};
    std::optional<box> missing = v.global_shape.empty()
                                     ? std::optional<box>(whole)
                                     : find_uncovered(boxes, idx, whole, uncovered_search_budget);
    return integrity_error(key, "shards leave a gap: main replicas (replica_id 0) on ranks [" +
                                    rank_list(holders) + "] cover " + std::to_string(covered) +
                                    " of " + std::to_string(numel(v.global_shape)) + " elements" +
                                    (missing ? "; none holds " + missing->str() : ""));
  }
  return ok();
}

CAIRN_INLINE result<void> check_objects(const std::vector<rank_desc>& ranks) {
  std::map<std::string, int> unique_owner;
  std::map<std::string, std::pair<shape, std::int64_t>> object_count;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (const auto& o : ranks[r].objects) {
      if (o.replica_id != 0) continue;
      std::string u = object_unique_key(o.key, o.global_offset, o.global_shape);
      auto [it, fresh] = unique_owner.try_emplace(u, r);
      if (!fresh)
        return integrity_error(o.key, "sharded object " + u + " is saved by rank " +
                                          std::to_string(it->second) + " and rank " +
                                          std::to_string(r) + " (set replica_id on all but one)");
      auto& [gs, count] = object_count[o.key];
      gs = o.global_shape;
      ++count;
    }
  }
  for (const auto& [key, gc] : object_count)
    if (gc.second != numel(gc.first))
      return integrity_error(key, "sharded object grid " +
                                      box{shape(gc.first.size(), 0), gc.first}.str() + " expects " +
                                      std::to_string(numel(gc.first)) + " shards, ranks saved " +
                                      std::to_string(gc.second));
  return ok();
}

CAIRN_INLINE result<std::map<std::string, int>> common_holders(
    const std::vector<std::vector<common_desc>>& by_rank, bool check) {
  struct first_holder {
    const common_desc* desc;
    int rank;
    std::size_t holders;
  };
  std::map<std::string_view, first_holder> seen;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r)
    for (const common_desc& c : by_rank[static_cast<std::size_t>(r)]) {
      auto [it, fresh] = seen.try_emplace(c.path, first_holder{&c, r, 0});
      first_holder& f = it->second;
      ++f.holders;
      if (fresh || !check || c.hash == f.desc->hash) continue;
      const std::string a = "rank " + std::to_string(f.rank), b = "rank " + std::to_string(r);
      return integrity_error(
          c.path,
          "common value differs across ranks: " +
              (f.desc->shown.empty() ? a + " and " + b
                                     : f.desc->shown + " on " + a + ", " + c.shown + " on " + b) +
              "; the ranks that declare a common value must hold the same value (a "
              "value per rank is a sharded object: cairn::per_rank)");
    }
  std::map<std::string, int> out;
  for (const auto& [path, f] : seen)
    if (f.holders != by_rank.size()) out.emplace(std::string(path), f.rank);
  return out;
}

CAIRN_INLINE result<void> check_commons(const std::vector<rank_desc>& ranks) {
  std::vector<std::vector<common_desc>> by_rank;
  by_rank.reserve(ranks.size());
  for (const rank_desc& d : ranks) by_rank.push_back(d.commons);
  CAIRN_TRY(common_holders(by_rank, true));
  return ok();
}

CAIRN_INLINE result<void> check_layout(const std::vector<rank_desc>& ranks) {
  CAIRN_TRY_ASSIGN(auto tensors, collect_integrity_tensors(ranks));
  for (auto& [key, v] : tensors) {
    CAIRN_TRY(check_no_overlap(key, v));
    CAIRN_TRY(check_covered(key, v));
  }
  return check_objects(ranks);
}

CAIRN_INLINE result<void> check_unique_objects(const std::vector<rank_desc>& all) {
  std::map<std::string, int> owner;
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    for (const auto& o : all[r].objects)
      if (o.replica_id == 0)
        if (auto [it, fresh] =
                owner.try_emplace(object_unique_key(o.key, o.global_offset, o.global_shape), r);
            !fresh)
          return make_error(errc::integrity, "sharded object " + it->first + " is saved by rank " +
                                                 std::to_string(it->second) + " and rank " +
                                                 std::to_string(r))
              .with_key(o.key);
  return ok();
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> validate_integrity(const std::vector<rank_desc>& ranks) {
  CAIRN_TRY(detail::check_layout(ranks));
  return detail::check_commons(ranks);
}

CAIRN_INLINE extent& save_index::where(const write_slot& s) {
  return s.is_object ? objects.at(s.key).where : tensors.at(s.key).chunks.at(s.chunk).where;
}

CAIRN_INLINE bool save_index::tiled() const {
  for (const auto& [k, t] : tensors)
    for (const auto& c : t.chunks)
      if (!c.tiles.empty()) return true;
  return false;
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE std::vector<box_group> collect_box_groups(const std::vector<rank_desc>& ranks,
                                                       save_index& L,
                                                       bool rotate) {
  const int world = static_cast<int>(ranks.size());
  std::vector<box_group> groups;
  std::map<std::pair<std::string, std::pair<shape, shape>>, std::size_t> index;
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < world; ++r)
      for (std::size_t i = 0; i < ranks[r].tensors.size(); ++i) {
        const tensor_desc& t = ranks[r].tensors[i];
        auto& rec = L.tensors[t.key];
        rec.type = t.type;
        rec.global_shape = t.global_shape;
        if ((t.replica_id == 0) != (pass == 0)) continue;
        for (std::size_t p = 0; p < t.pieces.size(); ++p) {
          auto id = std::make_pair(t.key, std::make_pair(t.pieces[p].offset, t.pieces[p].size));
          auto it = index.find(id);
          if (it == index.end()) {
            if (pass == 1) continue;  // a replica of nothing written: its data is covered
            index.emplace(id, groups.size());
            groups.push_back(box_group{&L.tensors.find(t.key)->first,
                                       t.pieces[p],
                                       dtype_size(t.type),
                                       {},
                                       rotate ? key_hash(t.key) + p : 0});
            it = index.find(id);
          } else if (pass == 0) {
            continue;  // a second main copy of the same box (validation reports overlaps)
          }
          groups[it->second].holders.push_back(box_holder{r, i, p});
        }
      }
  return groups;
}

CAIRN_INLINE std::vector<std::size_t> largest_first(const std::vector<box_group>& groups) {
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return groups[a].bytes() > groups[b].bytes();
  });
  return order;
}

CAIRN_INLINE std::size_t part_count(const box_group& g, std::uint64_t split_min_bytes) {
  std::int64_t volume = g.region.volume();
  std::size_t k = std::min<std::size_t>(
      g.holders.size(),
      std::max<std::uint64_t>(
          1, (g.bytes() + split_min_bytes - 1) / std::max<std::uint64_t>(split_min_bytes, 1)));
  k = static_cast<std::size_t>(
      std::min<std::int64_t>(static_cast<std::int64_t>(k), std::max<std::int64_t>(volume, 1)));
  return k;
}

CAIRN_INLINE std::size_t least_loaded_holder(const box_group& g,
                                             const std::vector<bool>& used,
                                             const std::vector<std::uint64_t>& bytes_of_rank) {
  const std::size_t n = g.holders.size();
  std::size_t best = n;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t h = (i + g.rotation % n) % n;
    if (!used[h] &&
        (best == n || bytes_of_rank[g.holders[h].rank] < bytes_of_rank[g.holders[best].rank]))
      best = h;
  }
  return best;
}

CAIRN_INLINE std::vector<write_part> balance_parts(const std::vector<box_group>& groups,
                                                   std::uint64_t split_min_bytes,
                                                   std::vector<std::uint64_t>& bytes_of_rank) {
  std::vector<write_part> parts;
  for (std::size_t gi : largest_first(groups)) {
    const box_group& g = groups[gi];
    std::int64_t volume = g.region.volume();
    std::size_t k = part_count(g, split_min_bytes);
    std::vector<bool> used(g.holders.size(), false);
    for (std::size_t j = 0; j < k; ++j) {
      std::int64_t b = volume * static_cast<std::int64_t>(j) / static_cast<std::int64_t>(k);
      std::int64_t e = volume * static_cast<std::int64_t>(j + 1) / static_cast<std::int64_t>(k);
      std::size_t best = least_loaded_holder(g, used, bytes_of_rank);
      used[best] = true;
      std::vector<piece> subs;  // not a ?: of an initializer list: g++ 16 warns on that
      if (k == 1)
        subs.push_back(piece{g.region, 0});
      else
        subs = flat_range_boxes(g.region, b, e);
      for (auto& sp : subs) {
        sp.data_offset += b;
        bytes_of_rank[g.holders[best].rank] +=
            static_cast<std::uint64_t>(sp.region.volume()) * g.elem_size;
        parts.push_back(write_part{gi, g.holders[best], std::move(sp)});
      }
    }
  }
  return parts;
}

CAIRN_INLINE void place_chunks(std::vector<write_part>& parts,
                               const std::vector<box_group>& groups,
                               std::uint64_t block_size,
                               tiling tile,
                               std::vector<std::uint64_t>& offset,
                               save_index& L) {
  std::stable_sort(parts.begin(), parts.end(), [&](const write_part& a, const write_part& b) {
    const box_group& ga = groups[a.group];
    const box_group& gb = groups[b.group];
    if (*ga.key != *gb.key) return *ga.key < *gb.key;
    if (a.group != b.group) return a.group < b.group;
    return a.sub.data_offset < b.sub.data_offset;
  });
  for (const write_part& pt : parts) {
    const box_group& g = groups[pt.group];
    auto& rec = L.tensors.at(*g.key);
    int r = pt.who.rank;
    std::uint64_t n = static_cast<std::uint64_t>(pt.sub.region.volume()) * g.elem_size;
    tile_counts tiles =
        tile ? choose_tiles(pt.sub.region, g.elem_size, block_size, rec.global_shape, tile)
             : tile_counts{};
    rec.chunks.push_back(chunk_record{
        pt.sub.region, extent{static_cast<std::uint32_t>(r), offset[r], n, {}}, std::move(tiles)});
    L.slots[r].push_back(write_slot{false, *g.key, rec.chunks.size() - 1, pt.who.leaf, pt.who.piece,
                                    pt.sub.data_offset});
    offset[r] += n;
  }
}

CAIRN_INLINE void place_objects(const std::vector<rank_desc>& ranks,
                                std::vector<std::uint64_t>& offset,
                                save_index& L) {
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (std::size_t i = 0; i < ranks[r].objects.size(); ++i) {
      const object_desc& o = ranks[r].objects[i];
      if (o.replica_id != 0) continue;
      std::string u = object_unique_key(o.key, o.global_offset, o.global_shape);
      L.objects[u] = object_record{o.key, o.global_shape, o.global_offset,
                                   extent{static_cast<std::uint32_t>(r), offset[r], o.nbytes, {}}};
      L.slots[r].push_back(write_slot{true, u, 0, i, 0, 0});
      offset[r] += o.nbytes;
      L.bytes_of_rank[r] += o.nbytes;
    }
  }
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE save_index plan_save(const std::vector<rank_desc>& ranks,
                                  std::uint64_t block_size,
                                  std::uint64_t split_min_bytes,
                                  tiling tile,
                                  bool rotate) {
  save_index L;
  L.world_size = static_cast<int>(ranks.size());
  L.block_size = block_size;
  L.slots.resize(ranks.size());
  L.bytes_of_rank.assign(ranks.size(), 0);
  std::vector<detail::box_group> groups = detail::collect_box_groups(ranks, L, rotate);
  std::vector<detail::write_part> parts =
      detail::balance_parts(groups, split_min_bytes, L.bytes_of_rank);
  std::vector<std::uint64_t> offset(ranks.size(), 0);
  detail::place_chunks(parts, groups, block_size, tile, offset, L);
  detail::place_objects(ranks, offset, L);
  return L;
}

}  // namespace cairn
