// cairn/core/sharded_tensor-inl.hpp: the bodies of cairn/core/sharded_tensor.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <numeric>

#include "cairn/core/sharded_tensor.hpp"

namespace cairn {

CAIRN_INLINE std::int64_t numel(const shape& s) noexcept {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

CAIRN_INLINE std::string shape_str(const shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

CAIRN_INLINE even_part even_split(std::int64_t size, int index, int count) {
  if (count < 1 || index < 0 || index >= count || size < 0)
    throw exception(make_error(errc::invalid_argument,
                               "even_split: share " + std::to_string(index) + " of " +
                                   std::to_string(count) + " of " + std::to_string(size) +
                                   " elements (needs count >= 1, 0 <= index < count, size >= 0)"));
  const std::int64_t base = size / count, extra = size % count;
  const std::int64_t offset = index * base + std::min<std::int64_t>(index, extra);
  return {offset, base + (index < extra ? 1 : 0)};
}

CAIRN_INLINE flat_range even_flat_range(std::int64_t numel, int index, int count) {
  const even_part p = even_split(numel, index, count);
  return {p.offset, p.end()};
}

CAIRN_INLINE std::optional<std::int64_t> checked_numel(const shape& s,
                                                       std::size_t elem_size) noexcept {
  if (elem_size == 0 || elem_size > static_cast<std::size_t>(max_tensor_bytes)) return std::nullopt;
  // The non-zero extents must multiply within the bound too: {2^62, 2^62, 0} holds nothing,
  // but numel() and box arithmetic over it would still overflow on the way.
  std::int64_t n = static_cast<std::int64_t>(elem_size);
  bool zero = false;
  for (std::int64_t d : s) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      zero = true;
      continue;
    }
    if (d > max_tensor_bytes / n) return std::nullopt;
    n *= d;
  }
  if (zero) return 0;
  return n / static_cast<std::int64_t>(elem_size);
}

CAIRN_INLINE shape tensor_sharding::global_block_shape() const {
  shape s(static_cast<std::size_t>(prepend_axis_num), 1);
  s.insert(s.end(), local_shape.begin(), local_shape.end());
  return s;
}

CAIRN_INLINE result<void> validate_sharding(const tensor_sharding& t, std::size_t data_elems) {
  auto fail = [&](std::string msg) {
    return make_error(errc::invalid_argument, std::move(msg)).with_key(t.key);
  };
  if (t.key.empty()) return fail("sharded tensor has an empty key");
  if (t.prepend_axis_num < 0) return fail("prepend_axis_num is negative");
  std::size_t rank = t.local_shape.size() + static_cast<std::size_t>(t.prepend_axis_num);
  if (t.global_shape.size() != rank || t.global_offset.size() != rank)
    return fail("global_shape and global_offset need " + std::to_string(rank) +
                " axes (local axes + prepend_axis_num), got " +
                std::to_string(t.global_shape.size()) + " and " +
                std::to_string(t.global_offset.size()));
  if (!t.axis_fragmentations.empty() && t.axis_fragmentations.size() != rank)
    return fail("axis_fragmentations must be empty or have one entry per global axis");
  shape block = t.global_block_shape();
  for (std::size_t a = 0; a < rank; ++a) {
    if (block[a] < 0 || t.global_offset[a] < 0 || t.global_shape[a] < 0)
      return fail("negative extent or offset on axis " + std::to_string(a));
    if (block[a] > t.global_shape[a] || t.global_offset[a] > t.global_shape[a] - block[a])
      return fail("block [" + std::to_string(t.global_offset[a]) + ", " +
                  std::to_string(t.global_offset[a] + block[a]) + ") on axis " + std::to_string(a) +
                  " exceeds global size " + std::to_string(t.global_shape[a]));
  }
  if (!checked_numel(t.global_shape, dtype_size(t.type)))
    return fail("global shape has more than 2^62 bytes");
  if (t.flattened_range) {
    auto [b, e] = *t.flattened_range;
    if (b < 0 || e < b || e > numel(t.local_shape))
      return fail("flattened_range [" + std::to_string(b) + ", " + std::to_string(e) +
                  ") is outside the block of " + std::to_string(numel(t.local_shape)) +
                  " elements");
  }
  if (static_cast<std::int64_t>(data_elems) != t.data_numel()) {
    if (data_elems == 0 && t.global_shape.empty() && !t.flattened_range)
      return fail(
          "the tensor view was never set (no data, no shape): describe it with "
          "cairn::even_block, from_rank_offsets, block or replicated before saving or "
          "loading, or leave it out of the tree");
    return fail("data holds " + std::to_string(data_elems) + " elements but the sharding needs " +
                std::to_string(t.data_numel()));
  }
  return ok();
}

CAIRN_INLINE tensor_sharding rank_offsets_sharding(std::string key,
                                                   dtype type,
                                                   shape local_shape,
                                                   axis_splits splits,
                                                   int replica_id,
                                                   int prepend_axis_num) {
  tensor_sharding t;
  t.key = std::move(key);
  t.type = type;
  t.local_shape = std::move(local_shape);
  t.prepend_axis_num = prepend_axis_num;
  t.global_shape = t.global_block_shape();
  t.global_offset.assign(t.global_shape.size(), 0);
  t.axis_fragmentations.assign(t.global_shape.size(), 1);
  for (const axis_split& s : splits) {
    if (s.axis < 0 || static_cast<std::size_t>(s.axis) >= t.global_shape.size() || s.count < 1 ||
        s.index < 0 || s.index >= s.count)
      throw exception(make_error(errc::invalid_argument, "from_rank_offsets: bad split (axis " +
                                                             std::to_string(s.axis) + ", index " +
                                                             std::to_string(s.index) + " of " +
                                                             std::to_string(s.count) + ")")
                          .with_key(t.key));
    auto a = static_cast<std::size_t>(s.axis);
    t.global_offset[a] += s.index * t.global_shape[a];
    t.global_shape[a] *= s.count;
    t.axis_fragmentations[a] *= s.count;
  }
  t.replica_id = replica_id;
  return t;
}

}  // namespace cairn
