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

namespace detail {

/// The files of a safetensors checkpoint: those its index names, `model.safetensors`, or else
/// every `*.safetensors` file at the top of the storage (DCP's `HuggingFaceStorageWriter` with
/// `save_distributed=True` writes one per rank and output file, with no index).
CAIRN_INLINE result<std::vector<std::string>> safetensors_files(storage_ref st, bool& listed) {
  std::vector<std::string> names;
  listed = false;
  CAIRN_TRY_ASSIGN(bool has_index, st.exists(safetensors::index_name));
  if (has_index) {
    CAIRN_TRY_ASSIGN(safetensors::index ix, safetensors::read_index(st, safetensors::index_name));
    std::set<std::string> seen;
    for (const auto& [k, f] : ix.weight_map)
      if (seen.insert(f).second) names.push_back(f);
    return names;
  }
  CAIRN_TRY_ASSIGN(bool has_one, st.exists(format_files::safetensors_one));
  if (has_one) return std::vector<std::string>{std::string(format_files::safetensors_one)};
  CAIRN_TRY_ASSIGN(std::vector<std::string> all, st.list(""));
  for (auto& n : all)
    if (format_files::is_top_level_safetensors(n)) names.push_back(n);
  listed = true;
  return names;
}

}  // namespace detail

CAIRN_INLINE result<checkpoint_metadata> safetensors_as_metadata(storage_ref st) {
  checkpoint_metadata m;
  m.format = "safetensors";
  m.block_size = foreign_read_block;
  m.save_id = "safetensors";
  bool listed = false;
  CAIRN_TRY_ASSIGN(std::vector<std::string> names, detail::safetensors_files(st, listed));
  if (names.empty())
    return make_error(errc::incomplete_checkpoint,
                      "no safetensors checkpoint: no model.safetensors.index.json, "
                      "model.safetensors or *.safetensors file")
        .with_file(st.describe(""));
  // Tensors whose pieces carry DCP_SHARDING_INFO offsets may be spread over several files; the
  // others are whole, in one file.
  std::set<std::string> whole;
  for (const auto& name : names) {
    CAIRN_TRY_ASSIGN(safetensors::header h, safetensors::read_header(st, name));
    auto fi = static_cast<std::uint32_t>(m.files.size());
    m.files.push_back(file_record{name, 0, h.file_size});
    std::map<std::string, shape> offsets;
    auto sharding = h.metadata.find(std::string(safetensors::dcp_sharding_info_key));
    if (sharding != h.metadata.end()) {
      CAIRN_TRY_ASSIGN(
          offsets, safetensors::sharding_offsets_from_json(sharding->second, st.describe(name)));
    } else if (listed) {
      // Without an index, only DCP's sharded files make a checkpoint: a folder of other
      // safetensors files is an unfinished save (the index is written last) or not a checkpoint.
      return make_error(errc::incomplete_checkpoint,
                        "safetensors file without DCP_SHARDING_INFO and no "
                        "model.safetensors.index.json: an unfinished save, or not a checkpoint")
          .with_file(st.describe(name));
    }
    for (const auto& [k, v] : h.metadata)
      if (k != safetensors::dcp_sharding_info_key) m.content_metadata.emplace(k, v);
    for (const auto& t : h.tensors) {
      auto off = offsets.find(t.name);
      const bool piece = off != offsets.end();
      shape at = piece ? off->second : shape(t.dims.size(), 0);
      if (at.size() != t.dims.size())
        return make_error(errc::corrupt, "safetensors: DCP_SHARDING_INFO saved_offsets has " +
                                             std::to_string(at.size()) +
                                             " entries for a tensor of " +
                                             std::to_string(t.dims.size()) + " dimensions")
            .with_key(t.name)
            .with_file(st.describe(name));
      auto [it, fresh] = m.tensors.try_emplace(t.name);
      tensor_record& rec = it->second;
      if (fresh) {
        rec.type = t.type;
        rec.global_shape = shape(t.dims.size(), 0);
        if (!piece) whole.insert(t.name);
      } else if (!piece || whole.contains(t.name)) {
        return make_error(errc::corrupt, "safetensors: tensor is in two files")
            .with_key(t.name)
            .with_file(st.describe(name));
      } else if (rec.type != t.type || rec.global_shape.size() != t.dims.size()) {
        return make_error(errc::corrupt,
                          "safetensors: a piece of this tensor has another dtype or rank than "
                          "its other pieces")
            .with_key(t.name)
            .with_file(st.describe(name));
      }
      for (std::size_t d = 0; d < at.size(); ++d) {
        if (at[d] > std::numeric_limits<std::int64_t>::max() - t.dims[d])
          return make_error(errc::corrupt, "safetensors: DCP_SHARDING_INFO offset overflows")
              .with_key(t.name)
              .with_file(st.describe(name));
        rec.global_shape[d] = std::max(rec.global_shape[d], at[d] + t.dims[d]);
      }
      rec.chunks.push_back(chunk_record{
          box{std::move(at), t.dims}, extent{fi, t.file_offset(), t.nbytes(), {}}, {}});
    }
  }
  return m;
}

}  // namespace cairn
