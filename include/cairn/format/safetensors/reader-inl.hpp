// cairn/format/safetensors/reader-inl.hpp: the bodies of cairn/format/safetensors/reader.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "cairn/core/common_value.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/reader.hpp"

namespace cairn {

CAIRN_INLINE result<checkpoint_metadata> safetensors_as_metadata(storage_ref st) {
  checkpoint_metadata m;
  m.format = "safetensors";
  m.block_size = foreign_read_block;
  m.save_id = "safetensors";
  std::vector<std::string> names;
  CAIRN_TRY_ASSIGN(bool has_index, st.exists(safetensors::index_name));
  if (has_index) {
    CAIRN_TRY_ASSIGN(safetensors::index ix, safetensors::read_index(st, safetensors::index_name));
    std::set<std::string> seen;
    for (const auto& [k, f] : ix.weight_map)
      if (seen.insert(f).second) names.push_back(f);
  } else {
    names.emplace_back("model.safetensors");
  }
  for (const auto& name : names) {
    CAIRN_TRY_ASSIGN(safetensors::header h, safetensors::read_header(st, name));
    auto fi = static_cast<std::uint32_t>(m.files.size());
    m.files.push_back(file_record{name, 0, h.file_size});
    for (const auto& [k, v] : h.metadata) m.content_metadata.emplace(k, v);
    for (const auto& t : h.tensors) {
      tensor_record rec;
      rec.type = t.type;
      rec.global_shape = t.dims;
      rec.chunks.push_back(chunk_record{
          box{shape(t.dims.size(), 0), t.dims}, extent{fi, t.file_offset(), t.nbytes(), {}}, {}});
      if (!m.tensors.emplace(t.name, std::move(rec)).second)
        return make_error(errc::corrupt, "safetensors: tensor is in two files")
            .with_key(t.name)
            .with_file(st.describe(name));
    }
  }
  return m;
}

}  // namespace cairn
