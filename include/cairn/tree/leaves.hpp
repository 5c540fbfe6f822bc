// cairn/tree/leaves.hpp: the flat, non-template list of leaves a state tree turns into.
// Everything after visitation (planning, formats, I/O) works on this list.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"

namespace cairn {

/// A sharded tensor found in the tree: its layout and the user's memory.
struct tensor_leaf {
  std::string path;  ///< where it sits in the tree ("layers.0.w")
  tensor_sharding sharding;
  std::byte* data = nullptr;  ///< data_numel() * dtype_size(type) bytes of user memory
  std::size_t nbytes = 0;
  /// `data` is device memory that the save's writer reads through a staging window (set by
  /// the save pipeline, never by the tree).
  bool on_device = false;
};

/// A sharded object found in the tree, with type-erased encode/decode of its value.
struct object_leaf {
  std::string path;
  std::string key;
  shape global_shape;
  shape global_offset;
  int replica_id = 0;
  void* value = nullptr;
  std::vector<std::byte> (*encode)(const void* value) = nullptr;
  result<void> (*decode)(std::span<const std::byte> in, void* value) = nullptr;
};

/// A common value found in the tree (identical on every rank that declares its path: all of
/// them, or a group such as one pipeline stage's ranks), with type-erased access.
struct common_leaf {
  std::string path;  ///< also its key in the checkpoint
  void* value = nullptr;
  common_value (*encode)(const void* value) = nullptr;
  result<void> (*decode)(const common_value& in, void* value) = nullptr;
};

/// Every leaf of a state tree, in visitation order.
struct leaf_list {
  std::vector<tensor_leaf> tensors;
  std::vector<object_leaf> objects;
  std::vector<common_leaf> commons;
  /// Views made by `adapter<T>::view` and trees built by factories that leaves point into;
  /// kept alive with the list.
  std::vector<std::shared_ptr<void>> keep_alive;
  /// Run in order after a successful load (factories' merge functions).
  std::vector<std::function<result<void>()>> after_load;
};

}  // namespace cairn
