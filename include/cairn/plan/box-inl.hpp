// cairn/plan/box-inl.hpp: the bodies of cairn/plan/box.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/plan/box.hpp"

namespace cairn {

CAIRN_INLINE bool box::contains(const box& b) const noexcept {
  for (std::size_t a = 0; a < size.size(); ++a)
    if (b.offset[a] < offset[a] || b.offset[a] + b.size[a] > offset[a] + size[a]) return false;
  return true;
}

CAIRN_INLINE std::string box::str() const {
  std::string s = "[";
  for (std::size_t a = 0; a < std::max(size.size(), offset.size()); ++a) {
    if (a) s += ", ";
    if (a >= size.size() || a >= offset.size()) {
      s += "?";
      continue;
    }
    std::int64_t end = 0;
    if (__builtin_add_overflow(offset[a], size[a], &end))
      s += std::to_string(offset[a]) + ":+" + std::to_string(size[a]);
    else
      s += std::to_string(offset[a]) + ":" + std::to_string(end);
  }
  return s + "]";
}

CAIRN_INLINE std::optional<box> intersect(const box& a, const box& b) {
  box r;
  r.offset.resize(a.size.size());
  r.size.resize(a.size.size());
  for (std::size_t i = 0; i < a.size.size(); ++i) {
    std::int64_t lo = std::max(a.offset[i], b.offset[i]);
    std::int64_t hi = std::min(a.offset[i] + a.size[i], b.offset[i] + b.size[i]);
    if (hi <= lo) return std::nullopt;
    r.offset[i] = lo;
    r.size[i] = hi - lo;
  }
  return r;
}

CAIRN_INLINE result<void> check_box_read(const shape& dims,
                                         const box& region,
                                         std::size_t elem_size,
                                         std::size_t out_bytes,
                                         const std::string& key) {
  if (region.offset.size() != dims.size() || region.size.size() != dims.size())
    return make_error(errc::invalid_argument,
                      "box " + region.str() + " has " + std::to_string(region.size.size()) +
                          " axes, the tensor " + std::to_string(dims.size()))
        .with_key(key);
  for (std::size_t a = 0; a < dims.size(); ++a)
    // Compared without adding: offset + size may overflow for a hostile box.
    if (region.offset[a] < 0 || region.size[a] < 0 || region.offset[a] > dims[a] ||
        region.size[a] > dims[a] - region.offset[a])
      return make_error(errc::invalid_argument, "box " + region.str() + " lies outside the tensor")
          .with_key(key);
  if (out_bytes != static_cast<std::uint64_t>(region.volume()) * elem_size)
    return make_error(errc::invalid_argument,
                      "buffer of " + std::to_string(out_bytes) + " bytes for box " + region.str())
        .with_key(key);
  return ok();
}

CAIRN_INLINE std::vector<piece> flat_range_boxes(const box& whole,
                                                 std::int64_t begin,
                                                 std::int64_t end) {
  const shape& block = whole.size;
  const std::size_t n = block.size();
  std::vector<piece> out;
  if (n == 0) {
    if (end > begin) out.push_back(piece{box{{}, {}}, 0});
    return out;
  }
  shape stride(n, 1);
  for (std::size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * block[d];
  std::int64_t b = begin;
  while (b < end) {
    for (std::size_t d = 0; d < n; ++d) {
      if (b % stride[d] != 0) continue;
      std::int64_t idx = (b / stride[d]) % block[d];
      std::int64_t count = std::min((end - b) / stride[d], block[d] - idx);
      if (count < 1) continue;
      box r;
      r.offset.resize(n);
      r.size.resize(n);
      for (std::size_t k = 0; k < n; ++k) {
        if (k < d) {
          r.offset[k] = (b / stride[k]) % block[k];
          r.size[k] = 1;
        } else if (k == d) {
          r.offset[k] = idx;
          r.size[k] = count;
        } else {
          r.offset[k] = 0;
          r.size[k] = block[k];
        }
        r.offset[k] += whole.offset[k];
      }
      out.push_back(piece{std::move(r), b - begin});
      b += count * stride[d];
      break;
    }
  }
  return out;
}

CAIRN_INLINE std::vector<piece> pieces_of(const tensor_sharding& t) {
  box whole{t.global_offset, t.global_block_shape()};
  if (!t.flattened_range) return {piece{std::move(whole), 0}};
  return flat_range_boxes(whole, t.flattened_range->begin, t.flattened_range->end);
}

CAIRN_INLINE tile_counts choose_tiles(const box& b,
                                      std::size_t elem_size,
                                      std::uint64_t max_bytes,
                                      const shape& global,
                                      tiling slabs) {
  const std::size_t n = b.size.size();
  auto bytes_of = [&](const shape& k) {
    std::uint64_t v = elem_size;
    for (std::size_t a = 0; a < n; ++a)
      v *= static_cast<std::uint64_t>(tile_extent(b.size[a], k[a]));
    return v;
  };
  shape k(n, 1);
  if (n == 0 || max_bytes < elem_size) return {};
  const bool by_global = global.size() == n;
  auto weight = [&](std::size_t a) {
    bool sharded = by_global && b.size[a] < global[a];
    return k[a] * (sharded ? 1 : 2);
  };
  while (bytes_of(k) > max_bytes) {
    std::size_t best = n;
    for (std::size_t a = 0; a < n; ++a) {
      if (tile_extent(b.size[a], k[a]) <= 1) continue;
      if (best == n || weight(a) < weight(best) ||
          (weight(a) == weight(best) &&
           tile_extent(b.size[a], k[a]) > tile_extent(b.size[best], k[best])))
        best = a;
    }
    if (best == n) return {};
    // Double the cuts, but never past one element per tile.
    k[best] = std::min<std::int64_t>(k[best] * 2, b.size[best]);
  }
  // Slabs on top of the block tiles (which keep power-of-two loads along every axis exact).
  if (slabs > 1 && by_global)
    for (std::size_t a = 0; a < n; ++a)
      while (b.size[a] < global[a] && k[a] * 2 <= slabs && k[a] * 2 <= b.size[a] &&
             bytes_of(k) / 2 >= min_slab_bytes)
        k[a] *= 2;
  if (std::all_of(k.begin(), k.end(), [](std::int64_t c) { return c == 1; })) return {};
  return k;
}

CAIRN_INLINE std::int64_t tile_count(const box& b, const tile_counts& k) {
  std::int64_t c = 1;
  for (std::size_t a = 0; a < k.size(); ++a) {
    std::int64_t t = tile_extent(b.size[a], k[a]);
    c *= t == 0 ? 0 : (b.size[a] + t - 1) / t;
  }
  return c;
}

}  // namespace cairn
