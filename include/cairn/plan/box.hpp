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
#include "cairn/detail/config.hpp"

namespace cairn {

/// An axis-aligned N-d box in global coordinates: `offset` and `size` per axis.
struct box {
  shape offset;
  shape size;
  friend bool operator==(const box&, const box&) = default;
  /// Number of elements.
  std::int64_t volume() const noexcept { return numel(size); }
  /// Whether `b` (of the same rank, both inside one tensor) lies inside this box.
  bool contains(const box& b) const noexcept;
  /// "[0:4, 8:16]". Also for a box read from a file and not yet checked: an end that does not
  /// fit 64 bits prints as "offset:+size", and missing axes as "?".
  std::string str() const;
};

/// The intersection of two boxes of the same rank, or nullopt when it is empty.
CAIRN_INLINE std::optional<box> intersect(const box& a, const box& b);

/// Checks a read of box `region` of a tensor of shape `dims` (`elem_size` bytes per element)
/// into a buffer of `out_bytes`: as many axes as the tensor, inside it, and a buffer of exactly
/// the box's bytes. errc::invalid_argument naming `key` otherwise.
CAIRN_INLINE result<void> check_box_read(const shape& dims,
                                         const box& region,
                                         std::size_t elem_size,
                                         std::size_t out_bytes,
                                         const std::string& key);

/// A contiguous part of a leaf's data that is one box of the global tensor, stored row-major.
struct piece {
  box region;                    ///< where it sits in the global tensor
  std::int64_t data_offset = 0;  ///< first element inside the leaf's data span
};

/// Splits the elements [begin, end) of a row-major box (flat indices relative to the box) into
/// at most 2·N-1 boxes, each contiguous in that order. `data_offset` of each piece is its
/// first flat index minus `begin`.
CAIRN_INLINE std::vector<piece> flat_range_boxes(const box& whole,
                                                 std::int64_t begin,
                                                 std::int64_t end);

/// Splits a tensor sharding into pieces. A plain block is one piece; a flattened range (a 1-D
/// slice of the row-major block) becomes at most 2·N-1 boxes, each contiguous in the slice.
CAIRN_INLINE std::vector<piece> pieces_of(const tensor_sharding& t);

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
CAIRN_INLINE tile_counts choose_tiles(const box& b,
                                      std::size_t elem_size,
                                      std::uint64_t max_bytes,
                                      const shape& global = {},
                                      tiling slabs = block_tiles);

/// Number of tiles of `b` cut by `k` (1 when `k` is empty).
CAIRN_INLINE std::int64_t tile_count(const box& b, const tile_counts& k);

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

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/box-inl.hpp"
#endif
