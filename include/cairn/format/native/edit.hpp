// cairn/format/native/edit.hpp: edits of a committed native checkpoint that rewrite only its
// metadata: remove_sharded_tensors (Megatron's), dropping tensors without rewriting data.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Removes from the checkpoint on `st` every tensor whose key `drop` selects (Megatron's
/// `remove_sharded_tensors`). Native: `metadata.json` is read, checked, and written again
/// without them with one atomic `put`, so a reader sees the checkpoint before or after, never
/// between; their bytes stay in the data files, unreferenced (a later save into the directory
/// replaces them); format version 4 keeps its index files as they are. torch_dist: as Megatron
/// does, every item whose fqn `drop` selects, tensors and sharded objects, leaves `.metadata`
/// (`dcp::remove_items`), and `.distcp` files left unreferenced are removed. Returns the
/// removed keys, sorted; when none matches, nothing is written. safetensors is refused with
/// errc::unsupported_version: convert it first.
CAIRN_INLINE result<std::vector<std::string>> remove_sharded_tensors(
    storage_ref st, const std::function<bool(std::string_view key)>& drop);

/// `remove_sharded_tensors` of every tensor whose key starts with `key_prefix` (Megatron's
/// signature).
CAIRN_INLINE result<std::vector<std::string>> remove_sharded_tensors(storage_ref st,
                                                                     std::string_view key_prefix);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/edit-inl.hpp"
#endif
