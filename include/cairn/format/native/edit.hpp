// cairn/format/native/edit.hpp: edits of a committed native checkpoint that rewrite only its
// metadata: remove_sharded_tensors (Megatron's), dropping tensors without rewriting data.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Removes from the native checkpoint on `st` every tensor whose key `drop` selects (Megatron's
/// `remove_sharded_tensors`): `metadata.json` is read, checked, and written again without them
/// with one atomic `put`, so a reader sees the checkpoint before or after, never between. Their
/// bytes stay in the data files, unreferenced (a later save into the directory replaces them);
/// format version 4 keeps its index files as they are. Returns the removed keys, sorted; when
/// none matches, nothing is written. Other layouts (torch_dist, safetensors) are refused with
/// errc::unsupported_version: convert them first.
inline result<std::vector<std::string>> remove_sharded_tensors(
    storage_ref st, const std::function<bool(std::string_view key)>& drop) {
  return detail::catch_all("removing tensors", [&]() -> result<std::vector<std::string>> {
    CAIRN_TRY_ASSIGN(std::string format, detect_format(st));
    if (format != "cairn") {
      if (format.empty()) return read_manifest(st).err();  // its error: no checkpoint here
      return make_error(errc::unsupported_version,
                        "remove_sharded_tensors edits cairn's native format; this is a " + format +
                            " checkpoint (cairn convert it to native first)")
          .with_file(st.describe(""));
    }
    CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_manifest(st));
    std::vector<std::string> removed;
    for (auto it = m.tensors.begin(); it != m.tensors.end();) {
      if (!drop(it->first)) {
        ++it;
        continue;
      }
      removed.push_back(it->first);
      m.index_refs.erase(it->first);
      it = m.tensors.erase(it);
    }
    if (removed.empty()) return removed;
    const std::string json = to_json(m);
    CAIRN_TRY(st.put(metadata_name, std::as_bytes(std::span(json))));
    return removed;
  });
}

/// `remove_sharded_tensors` of every tensor whose key starts with `key_prefix` (Megatron's
/// signature).
inline result<std::vector<std::string>> remove_sharded_tensors(storage_ref st,
                                                               std::string_view key_prefix) {
  const std::string prefix(key_prefix);
  return remove_sharded_tensors(st, [prefix](std::string_view k) { return k.starts_with(prefix); });
}

}  // namespace cairn
