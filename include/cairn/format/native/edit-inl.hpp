// cairn/format/native/edit-inl.hpp: the bodies of cairn/format/native/edit.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/native/edit.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"

namespace cairn {

CAIRN_INLINE result<std::vector<std::string>> remove_sharded_tensors(
    storage_ref st, const std::function<bool(std::string_view key)>& drop) {
  return detail::catch_all("removing tensors", [&]() -> result<std::vector<std::string>> {
    CAIRN_TRY_ASSIGN(std::string format, detect_format(st));
    if (format == "torch_dist") return dcp::remove_items(st, drop);
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

CAIRN_INLINE result<std::vector<std::string>> remove_sharded_tensors(storage_ref st,
                                                                     std::string_view key_prefix) {
  const std::string prefix(key_prefix);
  return remove_sharded_tensors(st, [prefix](std::string_view k) { return k.starts_with(prefix); });
}

}  // namespace cairn
