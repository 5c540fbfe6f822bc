// cairn/plan/box.hpp: N-d boxes, the pieces a sharded tensor's data splits into, and the
// row-run iteration that copies the intersection of two boxes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"

namespace cairn {

/// An axis-aligned N-d box in global coordinates: `offset` and `size` per axis.
struct box {
  shape offset;
  shape size;
  friend bool operator==(const box&, const box&) = default;
  /// Number of elements.
  std::int64_t volume() const noexcept { return numel(size); }
  /// Whether `b` (of the same rank, both inside one tensor) lies inside this box.
  bool contains(const box& b) const noexcept {
    for (std::size_t a = 0; a < size.size(); ++a)
      if (b.offset[a] < offset[a] || b.offset[a] + b.size[a] > offset[a] + size[a]) return false;
    return true;
  }
  /// "[0:4, 8:16]". Also for a box read from a file and not yet checked: an end that does not
  /// fit 64 bits prints as "offset:+size", and missing axes as "?".
  std::string str() const {
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
};

/// The intersection of two boxes of the same rank, or nullopt when it is empty.
inline std::optional<box> intersect(const box& a, const box& b) {
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

/// Checks a read of box `region` of a tensor of shape `dims` (`elem_size` bytes per element)
/// into a buffer of `out_bytes`: as many axes as the tensor, inside it, and a buffer of exactly
/// the box's bytes. errc::invalid_argument naming `key` otherwise.
inline result<void> check_box_read(const shape& dims,
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
    if (region.offset[a] < 0 || region.size[a] < 0 || region.offset[a] + region.size[a] > dims[a])
      return make_error(errc::invalid_argument, "box " + region.str() + " lies outside the tensor")
          .with_key(key);
  if (out_bytes != static_cast<std::uint64_t>(region.volume()) * elem_size)
    return make_error(errc::invalid_argument,
                      "buffer of " + std::to_string(out_bytes) + " bytes for box " + region.str())
        .with_key(key);
  return ok();
}

/// A contiguous part of a leaf's data that is one box of the global tensor, stored row-major.
struct piece {
  box region;                    ///< where it sits in the global tensor
  std::int64_t data_offset = 0;  ///< first element inside the leaf's data span
};

/// Splits the elements [begin, end) of a row-major box (flat indices relative to the box) into
/// at most 2·N-1 boxes, each contiguous in that order. `data_offset` of each piece is its
/// first flat index minus `begin`.
inline std::vector<piece> flat_range_boxes(const box& whole, std::int64_t begin, std::int64_t end) {
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

/// Splits a tensor sharding into pieces. A plain block is one piece; a flattened range (a 1-D
/// slice of the row-major block) becomes at most 2·N-1 boxes, each contiguous in the slice.
inline std::vector<piece> pieces_of(const tensor_sharding& t) {
  box whole{t.global_offset, t.global_block_shape()};
  if (!t.flattened_range) return {piece{std::move(whole), 0}};
  return flat_range_boxes(whole, t.flattened_range->begin, t.flattened_range->end);
}

/// How a chunk is cut into tiles: the number of tiles along each axis. Tile `j` of an axis
/// of extent `n` cut into `k` tiles spans [j·⌈n/k⌉, min((j+1)·⌈n/k⌉, n)); an axis cut into 1 is
/// not cut. Empty: the chunk is not tiled.
using tile_counts = shape;

/// How planning cuts chunks into tiles: `no_tiles`; `block_tiles`, only chunks larger than a
/// checksum block (`choose_tiles`); or n > 1, also into at least n slabs along each axis along
/// which the chunk is part of its tensor (format version 4, `index_slabs`).
using tiling = std::int64_t;
inline constexpr tiling no_tiles = 0, block_tiles = 1;
/// The slabs format version 4 cuts a chunk into along each sharded axis: a reshard that cuts
/// a chunk anywhere reads at most one slab more than it needs at each cut (1/64 of the chunk's
/// extent), where block tiles may read half the chunk more.
inline constexpr tiling index_slabs = 64;
/// The smallest slab that slab cutting makes (bytes): checksums stay under 0.025% of the data,
/// and small parts (distributed-optimizer slices) stay few tiles for loads to plan.
inline constexpr std::uint64_t min_slab_bytes = std::uint64_t{32} << 10;

/// The tile extent along one axis of extent `n` cut into `k` tiles.
inline std::int64_t tile_extent(std::int64_t n, std::int64_t k) noexcept {
  return k <= 1 ? n : (n + k - 1) / k;
}

/// Chooses how to cut `b` (elements of `elem_size` bytes) into tiles of at most `max_bytes`.
/// Axes are halved in turn, so a chunk cut into 2^k tiles along an axis can be read back by
/// 2^k ranks along that axis without reading bytes they do not need. The axes along which `b`
/// is a part of the tensor (`global`, when given) are where the tensor is sharded, and where a
/// reshard most likely cuts again (tensor parallelism 4 -> 8): they count their cuts at half
/// weight, so they are cut first and about twice as often. Ties go to the axis with the larger
/// tile extent, then the lower axis. With `slabs` > 1, every sharded axis is then cut further,
/// up to `slabs` cuts (doubling, while a tile stays at least `min_slab_bytes`). Returns {} when
/// `b` is not cut (it fits in `max_bytes` and gets no slabs, or cannot be tiled).
inline tile_counts choose_tiles(const box& b,
                                std::size_t elem_size,
                                std::uint64_t max_bytes,
                                const shape& global = {},
                                tiling slabs = block_tiles) {
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

/// Number of tiles of `b` cut by `k` (1 when `k` is empty).
inline std::int64_t tile_count(const box& b, const tile_counts& k) {
  std::int64_t c = 1;
  for (std::size_t a = 0; a < k.size(); ++a) {
    std::int64_t t = tile_extent(b.size[a], k[a]);
    c *= t == 0 ? 0 : (b.size[a] + t - 1) / t;
  }
  return c;
}

/// Calls `fn(tile)` for each tile of `b` cut by `k`, in row-major order of the tile grid (the
/// order tiles are stored in). With `k` empty, calls `fn(b)` once.
template <class Fn>
void for_each_tile(const box& b, const tile_counts& k, Fn&& fn) {
  if (k.empty()) {
    fn(b);
    return;
  }
  const std::size_t n = b.size.size();
  shape t(n), count(n), idx(n, 0);
  for (std::size_t a = 0; a < n; ++a) {
    t[a] = tile_extent(b.size[a], k[a]);
    if (t[a] == 0) return;
    count[a] = (b.size[a] + t[a] - 1) / t[a];
  }
  box tile{shape(n), shape(n)};
  while (true) {
    for (std::size_t a = 0; a < n; ++a) {
      tile.offset[a] = b.offset[a] + idx[a] * t[a];
      tile.size[a] = std::min(t[a], b.size[a] - idx[a] * t[a]);
    }
    fn(static_cast<const box&>(tile));
    std::size_t a = n;
    while (a > 0) {
      --a;
      if (++idx[a] < count[a]) break;
      idx[a] = 0;
      if (a == 0) return;
    }
  }
}

/// Calls `fn(src_elem, dst_elem, count)` for each contiguous run of the elements of `region`,
/// where `src` and `dst` are row-major boxes that both contain `region`. Element indices are
/// relative to the start of each box. Trailing axes that both boxes hold whole are merged, so
/// a region that is contiguous in both is a single run.
template <class Fn>
void for_each_run(const box& src, const box& dst, const box& region, Fn&& fn) {
  const std::size_t n = region.size.size();
  if (n == 0) {
    fn(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
    return;
  }
  // Merge trailing axes: while an axis is whole in src, dst and region, fold it into the run.
  std::size_t inner = n - 1;  // the run spans axes [inner, n)
  std::int64_t run = region.size[n - 1];
  while (inner > 0 && region.size[inner] == src.size[inner] &&
         region.size[inner] == dst.size[inner]) {
    --inner;
    run *= region.size[inner];
  }
  shape src_stride(n, 1), dst_stride(n, 1);
  for (std::size_t d = n - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src.size[d];
    dst_stride[d - 1] = dst_stride[d] * dst.size[d];
  }
  // Iterate the outer axes [0, inner) of the region.
  shape idx(inner, 0);
  while (true) {
    std::int64_t s = 0, t = 0;
    for (std::size_t d = 0; d < n; ++d) {
      std::int64_t c = region.offset[d] + (d < inner ? idx[d] : 0);
      s += (c - src.offset[d]) * src_stride[d];
      t += (c - dst.offset[d]) * dst_stride[d];
    }
    fn(s, t, run);
    std::size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < region.size[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

}  // namespace cairn
