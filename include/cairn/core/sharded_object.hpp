// cairn/core/sharded_object.hpp: an opaque value with a position in a grid of ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/core/codec.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

/// An opaque serializable value owned by one position of a rank grid, like Megatron's
/// ShardedObject: per-rank RNG state has `global_shape = {world}`, `global_offset = {rank}`.
/// The value is encoded with `cairn::codec<T>`. On load, the value at the same key and offset
/// is decoded into `value`.
template <class T>
struct sharded_object {
  std::string key;      ///< object name, the same on every rank
  T value{};            ///< the value (saved, and overwritten on load)
  shape global_shape;   ///< size of the grid of positions (empty: a single object)
  shape global_offset;  ///< this rank's position in the grid
  int replica_id = 0;   ///< 0: main copy (written); others are skipped on save
};

/// The object key with its position, as Megatron names it: `key/shard_<offset>_<shape>`
/// (offset and shape joined by '.').
CAIRN_INLINE std::string object_unique_key(const std::string& key,
                                           const shape& offset,
                                           const shape& global);

/// A per-rank object: grid `{world_size}`, position `{rank}`.
template <class T>
sharded_object<T> per_rank(std::string key, T value, int rank, int world_size) {
  return {std::move(key), std::move(value), {world_size}, {rank}, 0};
}

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/sharded_object-inl.hpp"
#endif
