// cairn/core/sharded_tensor.hpp: one rank's piece of a global tensor, and the factories that
// describe common shardings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

/// A tensor shape or an N-d coordinate (element units).
using shape = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for a rank-0 shape). The shape must be valid (see
/// `checked_numel`): shapes read from files are checked when they are parsed.
CAIRN_INLINE std::int64_t numel(const shape& s) noexcept;

/// A shape as messages print it: "[12, 8]" ("[]" for a scalar).
CAIRN_INLINE std::string shape_str(const shape& s);

/// The most elements, or bytes, one tensor may have (2^62): products and sums of sizes below it
/// cannot overflow 64-bit arithmetic.
inline constexpr std::int64_t max_tensor_bytes = std::int64_t{1} << 62;

/// `numel(s)` when every extent is >= 0 and `numel(s) * elem_size` stays within
/// `max_tensor_bytes`; nullopt otherwise (a negative extent, or a size that would overflow).
/// Every shape taken from a file goes through this before it is used.
///
/// ```
/// checked_numel({1 << 20, 1 << 20}, 4)   // 2^40 (elements; 2^42 bytes)
/// checked_numel({1ll << 32, 1ll << 32})  // nullopt
/// ```
CAIRN_INLINE std::optional<std::int64_t> checked_numel(const shape& s,
                                                       std::size_t elem_size = 1) noexcept;

/// A half-open range [begin, end) of elements of the flattened local block, as a distributed
/// optimizer stores its slice of a parameter.
struct flat_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const flat_range&, const flat_range&) = default;
};

/// Where one rank's piece sits in a global tensor: everything a sharded tensor says except its
/// data. Field meanings follow Megatron-core's ShardedTensor.
struct tensor_sharding {
  std::string key;            ///< global tensor name; the same on every rank
  dtype type = dtype::f32;    ///< element type
  shape local_shape;          ///< shape of this rank's block (without prepended axes)
  shape global_shape;         ///< shape of the whole tensor
  shape global_offset;        ///< where the block starts; one entry per global axis
  shape axis_fragmentations;  ///< blocks per global axis; empty when irregular
  int replica_id = 0;         ///< 0: main copy (written); others are replicas (skipped)
  std::optional<flat_range> flattened_range;  ///< data holds only this slice of the block
  int prepend_axis_num = 0;                   ///< leading global axes of size 1 not present locally
  bool allow_shape_mismatch = false;  ///< on load: global shape may differ; rest zero-filled

  /// Number of elements the data span must hold (the flattened range or the whole block).
  std::int64_t data_numel() const noexcept {
    return flattened_range ? flattened_range->end - flattened_range->begin : numel(local_shape);
  }
  /// The block's shape in global coordinates: prepended axes of size 1, then `local_shape`.
  shape global_block_shape() const;
};

/// Checks a sharding for internal consistency against a data span of `data_elems` elements:
/// axis counts agree, the block lies inside the global shape, the flattened range lies inside
/// the block, and the data has exactly the right number of elements. Errors name the key.
CAIRN_INLINE result<void> validate_sharding(const tensor_sharding& t, std::size_t data_elems);

/// One rank's piece of a global tensor, viewing memory the user owns. Loading writes into
/// `data` in place. `T` is the element type; `sharded_tensor<>` (T = void) is the dynamically
/// typed form whose data is raw bytes and whose dtype is `type`.
template <class T = void>
struct sharded_tensor : tensor_sharding {
  static_assert(std::is_void_v<T> || element_type<T>,
                "cairn::sharded_tensor<T>: T must be a cairn element type (bool, integers, "
                "float, double, cairn::f16, cairn::bf16, cairn::f8_e4m3, cairn::f8_e5m2)");
  std::span<T> data;  ///< the user's memory: data_numel() elements, row-major

  /// The element type. It fixes the dtype: the inherited `type` field is ignored for typed
  /// tensors (visiting and the conversion to `sharded_tensor<>` take `dtype_of<T>`).
  using value_type = T;

  /// The data as raw bytes.
  std::span<std::byte> raw() const noexcept { return std::as_writable_bytes(data); }
  /// The dynamically typed view of the same piece.
  operator sharded_tensor<void>() const;  // NOLINT(implicit)
};

/// The dynamically typed sharded tensor: raw bytes and a run-time dtype.
template <>
struct sharded_tensor<void> : tensor_sharding {
  std::span<std::byte> data;  ///< the user's memory: data_numel() * dtype_size(type) bytes
  /// No static element type: the dtype is the `type` field.
  using value_type = void;

  std::span<std::byte> raw() const noexcept { return data; }
};

template <class T>
sharded_tensor<T>::operator sharded_tensor<void>() const {
  sharded_tensor<void> d;
  static_cast<tensor_sharding&>(d) = *this;
  d.type = dtype_of<T>;
  d.data = raw();
  return d;
}

/// How one axis is split: this rank holds block `index` of `count` equal blocks along `axis`
/// (Megatron's `(axis, rank_offset, fragmentations)` triple).
struct axis_split {
  int axis = 0;
  std::int64_t index = 0;
  std::int64_t count = 1;
};

/// The splits of a block, written in place (`{{axis, index, count}, ...}`) or built at run
/// time (a `std::vector<axis_split>` or any span). A view: it lives for the call it is passed to.
class axis_splits {
 public:
  axis_splits(std::initializer_list<axis_split> l) noexcept  // NOLINT(implicit)
      : s_(l.begin(), l.size()) {}
  axis_splits(std::span<const axis_split> s) noexcept : s_(s) {}     // NOLINT(implicit)
  axis_splits(const std::vector<axis_split>& v) noexcept : s_(v) {}  // NOLINT(implicit)
  auto begin() const noexcept { return s_.begin(); }
  auto end() const noexcept { return s_.end(); }

 private:
  std::span<const axis_split> s_;
};

/// One rank's share of an axis of `size` elements split as evenly as possible over `count`
/// ranks: the first `size % count` ranks get one element more (numpy's `array_split`, torch's
/// `tensor_split`). Right for any number of ranks, where `size / count` is not:
///
///     cairn::even_split(1024, r, 3)  // rank 0: 342 rows at 0; 1: 341 at 342; 2: 341 at 683
///
/// (DTensor's `Shard` cuts as `torch.chunk` does instead: pieces of `ceil(size / count)`.)
struct even_part {
  std::int64_t offset = 0;  ///< the share's first element
  std::int64_t size = 0;    ///< how many elements it has
  /// One past its last element.
  std::int64_t end() const noexcept { return offset + size; }
  friend bool operator==(const even_part&, const even_part&) = default;
};

/// Share `index` of `count` of an axis of `size` elements (see `even_part`). Throws
/// `cairn::exception` (`errc::invalid_argument`) for `count < 1`, `index` outside
/// `[0, count)` or a negative `size`.
CAIRN_INLINE even_part even_split(std::int64_t size, int index, int count);

/// The flat range of a block of `numel` elements that rank `index` of `count` holds: a
/// distributed optimizer's even slice of a parameter (`even_split` of the flattened block).
/// Use with `flattened` or `from_rank_offsets_flat`.
CAIRN_INLINE flat_range even_flat_range(std::int64_t numel, int index, int count);

/// The layout `from_rank_offsets` describes, for a dtype known only at run time: `local_shape`
/// is this rank's block (without prepended axes); each split multiplies the global size of its
/// axis by `count` and offsets the block by `index * local size`. Throws `cairn::exception`
/// (naming the key) for a split outside the axes or an index outside [0, count).
CAIRN_INLINE tensor_sharding rank_offsets_sharding(std::string key,
                                                   dtype type,
                                                   shape local_shape,
                                                   axis_splits splits,
                                                   int replica_id = 0,
                                                   int prepend_axis_num = 0);

/// Describes a block of an evenly split tensor, like Megatron's
/// `ShardedTensor.from_rank_offsets`: `local_shape` is this rank's block (without prepended
/// axes); each split multiplies the global size of its axis by `count` and offsets the block
/// by `index * local size`. Axes are global axes (they count prepended axes).
///
///     auto w = cairn::from_rank_offsets("layer0.w", std::span(buf), {1024, 256},
///                                       {{1, tp_rank, tp_size}});
///
/// The splits may also be built at run time (a `std::vector<axis_split>`).
template <element_type T>
sharded_tensor<T> from_rank_offsets(std::string key,
                                    std::span<T> data,
                                    shape local_shape,
                                    axis_splits splits,
                                    int replica_id = 0,
                                    int prepend_axis_num = 0) {
  sharded_tensor<T> t;
  static_cast<tensor_sharding&>(t) = rank_offsets_sharding(
      std::move(key), dtype_of<T>, std::move(local_shape), splits, replica_id, prepend_axis_num);
  t.data = data;
  return t;
}

/// `t` (a block described by any factory: `block` for uneven splits) with `data` holding only
/// the elements `range` of the block flattened row-major: a distributed optimizer's slice of a
/// parameter. Each slice is a main copy.
///
///     auto m = cairn::flattened(cairn::block("exp_avg", std::span<float>{}, {5, 8}, {11, 8},
///                                            {6, 0}), std::span(slice), {dp * 20, dp * 20 + 20});
template <element_type T>
sharded_tensor<T> flattened(sharded_tensor<T> t, std::span<T> data, flat_range range) {
  t.data = data;
  t.flattened_range = range;
  t.replica_id = 0;
  return t;
}

/// Like Megatron's `ShardedTensor.from_rank_offsets_flat`: the block is described as by
/// `from_rank_offsets`, but `data` holds only the elements `range` of the block flattened
/// row-major (a distributed optimizer's slice of a parameter). Ranks holding the other slices
/// of the same block pass the same splits and their own ranges; each slice is a main copy.
template <element_type T>
sharded_tensor<T> from_rank_offsets_flat(std::string key,
                                         std::span<T> data,
                                         shape local_shape,
                                         axis_splits splits,
                                         flat_range range,
                                         int prepend_axis_num = 0) {
  return flattened(
      from_rank_offsets(std::move(key), data, std::move(local_shape), splits, 0, prepend_axis_num),
      data, range);
}

/// Describes an arbitrary (possibly uneven) block: `global_offset` and `global_shape` given
/// explicitly. Use it for dimensions that do not divide evenly among ranks. With
/// `prepend_axis_num` n, the global tensor has n leading axes the local block lacks (a layer
/// index of stacked layers, say): `global_shape` and `global_offset` count them, `local_shape`
/// does not.
template <element_type T>
sharded_tensor<T> block(std::string key,
                        std::span<T> data,
                        shape local_shape,
                        shape global_shape,
                        shape global_offset,
                        int replica_id = 0,
                        int prepend_axis_num = 0) {
  sharded_tensor<T> t;
  t.key = std::move(key);
  t.type = dtype_of<T>;
  t.local_shape = std::move(local_shape);
  t.global_shape = std::move(global_shape);
  t.global_offset = std::move(global_offset);
  t.replica_id = replica_id;
  t.prepend_axis_num = prepend_axis_num;
  t.data = data;
  return t;
}

/// This rank's block of a tensor of `global_shape` split evenly along `axis` over `count` ranks,
/// for any `count` (`even_split`: the first `global_shape[axis] % count` ranks get one more
/// row). `data` holds the block, row-major: `even_split(global_shape[axis], index,
/// count).size` along `axis`, the whole extent along the other axes.
///
///     auto rows = cairn::even_split(1024, rank, world);
///     buf.resize(rows.size * 512);
///     auto w = cairn::even_block("model.weight", std::span(buf), {1024, 512}, 0, rank, world);
///
/// Throws `cairn::exception` naming `key` for an axis outside the shape or a bad split.
template <element_type T>
sharded_tensor<T> even_block(std::string key,
                             std::span<T> data,
                             shape global_shape,
                             int axis,
                             int index,
                             int count,
                             int replica_id = 0) {
  if (axis < 0 || static_cast<std::size_t>(axis) >= global_shape.size())
    throw exception(make_error(errc::invalid_argument, "even_block: axis " + std::to_string(axis) +
                                                           " is outside a tensor of " +
                                                           std::to_string(global_shape.size()) +
                                                           " axes")
                        .with_key(key));
  even_part part;
  try {
    part = even_split(global_shape[static_cast<std::size_t>(axis)], index, count);
  } catch (exception& e) {
    throw exception(error(e.err()).with_key(key));
  }
  shape local = global_shape, offset(global_shape.size(), 0);
  local[static_cast<std::size_t>(axis)] = part.size;
  offset[static_cast<std::size_t>(axis)] = part.offset;
  return block(std::move(key), data, std::move(local), std::move(global_shape), std::move(offset),
               replica_id);
}

/// Describes a tensor every rank holds whole; `replica_id` 0 marks the copy that is written
/// (typically `rank == 0` or data-parallel rank 0); the other copies share the writing.
template <element_type T>
sharded_tensor<T> replicated(std::string key,
                             std::span<T> data,
                             shape global_shape,
                             int replica_id) {
  shape offset(global_shape.size(), 0);
  auto t = block(std::move(key), data, global_shape, global_shape, std::move(offset), replica_id);
  t.axis_fragmentations.assign(t.global_shape.size(), 1);
  return t;
}

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/sharded_tensor-inl.hpp"
#endif
