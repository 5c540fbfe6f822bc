// cairn/load.hpp: loading a checkpoint into a state tree of any topology (`load`, `try_load`),
// and reading parts of a checkpoint without a tree (`load_common`, `load_tensors`). The phases
// live in cairn/pipeline/load.hpp, the planners in cairn/plan/.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/pipeline/load_cache.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/leaves.hpp"
#include "cairn/tree/visit.hpp"

namespace cairn {

namespace detail {
/// The non-template body of `load` (the phases are in cairn/pipeline/load.hpp).
CAIRN_INLINE result<load_stats> load_leaves(const leaf_list& tree_leaves,
                                            storage_ref st,
                                            comm_ref comm,
                                            const load_options& opt);
}  // namespace detail

/// A whole tensor read from a checkpoint, owning its bytes (row-major, little-endian).
struct tensor_data {
  dtype type = dtype::f32;
  shape global_shape;
  std::vector<std::byte> data;
  /// The data viewed as T; T must match `type`.
  template <element_type T>
  std::span<const T> as() const {
    if (dtype_of<T> != type)
      throw exception(make_error(errc::mismatch, "tensor is " + std::string(dtype_name(type)) +
                                                     ", asked for " +
                                                     std::string(dtype_name(dtype_of<T>))));
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
};

/// Loads a checkpoint into `tree` in place; every rank of `comm` calls it with the shards it
/// wants, in any topology (the checkpoint may have been saved on another number of ranks).
/// Each rank reads only the checksum blocks holding bytes it needs, and verifies them.
template <class Tree>
result<load_stats> try_load(Tree& tree,
                            storage_ref st,
                            comm_ref comm,
                            const load_options& opt = {}) {
  try {
    leaf_list leaves = flatten(tree);
    return detail::load_leaves(leaves, st, comm, opt);
  } catch (...) {
    return detail::current_exception_error("loading").with_rank(comm.rank());
  }
}

/// Throwing form of `try_load`.
template <class Tree>
load_stats load(Tree& tree, storage_ref st, comm_ref comm, const load_options& opt = {}) {
  return try_load(tree, st, comm, opt).value();
}

/// Reads only the common values of a checkpoint of any format (no tensors, and no index file of
/// a native one), by path. A foreign format's values come as Python holds them (I64, F64, BOOL,
/// strings).
CAIRN_INLINE result<std::map<std::string, common_value>> load_common(storage_ref st);

/// Reads the named tensors whole (any saved sharding, any format: native, torch_dist,
/// safetensors when their readers are in the program), on one process. An empty `keys` reads
/// every tensor. Of a native checkpoint's index files it reads only the directories and entries
/// of those keys. `progress` is told the bytes read ("read").
CAIRN_INLINE result<std::map<std::string, tensor_data>> load_tensors(
    storage_ref st,
    std::vector<std::string> keys = {},
    int threads = 2,
    const progress_callback& progress = {});

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/load-inl.hpp"
#  include "cairn/pipeline/load.hpp"  // the phases, with their bodies and load_leaves'
#endif
