// cairn/convert/diff.hpp: compares two checkpoints of any readable layout (`cairn diff A B`):
// tensors added or removed, dtype and shape changes, and, for tensors alike in both, how many
// elements differ and the largest absolute difference. Streams slab by slab, so memory stays
// bounded by the slab size whatever the checkpoints' size.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::convert {

/// How one tensor differs between two checkpoints.
struct tensor_diff {
  /// What changed.
  enum class change {
    added,    ///< only in the second checkpoint
    removed,  ///< only in the first
    dtype,    ///< the dtypes differ (values not compared)
    shape,    ///< the global shapes differ (values not compared)
    values,   ///< same dtype and shape, some elements differ
  };
  std::string key;
  change what = change::values;
  dtype type_a = dtype::f32, type_b = dtype::f32;  ///< the dtypes (added: b only; removed: a)
  shape shape_a, shape_b;                          ///< the global shapes
  std::uint64_t differing = 0;  ///< elements whose values differ (bitwise for f8 and NaN payloads)
  /// The largest |a - b| over the elements (NaN when one side holds NaN where the other does
  /// not; 0 when only bit patterns differ, as for f8 or -0.0).
  double max_abs = 0;
};

/// How one common value or sharded object differs between two checkpoints.
struct value_diff {
  std::string key;  ///< the common value's path, or the object's unique key
  tensor_diff::change what = tensor_diff::change::values;  ///< added, removed or values
  std::string a, b;  ///< each side, shown (`common_value::str`; "N bytes" for an object)
};

/// The result of `diff`.
struct diff_result {
  std::vector<tensor_diff> tensors;  ///< the tensors that differ, by key
  std::vector<value_diff> commons;   ///< the common values that differ, by path
  std::vector<value_diff> objects;   ///< the sharded objects that differ, by unique key
  /// The world sizes that saved each, where the format records one (told, not a difference:
  /// the same state saved by 4 ranks and by 2 is the same).
  std::optional<int> world_a, world_b;
  std::size_t compared = 0;          ///< tensors compared element by element
  std::size_t values_compared = 0;   ///< common values and objects compared
  std::uint64_t bytes_compared = 0;  ///< bytes read from each checkpoint for that
  /// Whether the two hold the same tensors, common values and objects.
  bool same() const noexcept { return tensors.empty() && commons.empty() && objects.empty(); }
};

namespace detail {

/// Element `i` of `bytes` (of dtype `t`) as a double; nullopt for f8 (compared bitwise).
CAIRN_INLINE std::optional<double> element_as_double(dtype t, const std::byte* p);

}  // namespace detail

/// Compares every tensor of `a` and `b` (any layouts `open_source` reads), reading both in
/// slabs of at most `slab_bytes` per side, then their common values, sharded objects and world
/// sizes. `progress` is told the tensor bytes compared per side ("diff").
CAIRN_INLINE result<diff_result> diff(source& a,
                                      source& b,
                                      std::uint64_t slab_bytes = 64ull << 20,
                                      const progress_callback& progress = {});

}  // namespace cairn::convert

#if CAIRN_HEADER_ONLY
#  include "cairn/convert/diff-inl.hpp"
#endif
