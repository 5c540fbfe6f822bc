// cairn/format/torch/state_dict-inl.hpp: the bodies of cairn/format/torch/state_dict.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/torch/state_dict.hpp"
#include "cairn/format/torch/zip.hpp"

namespace cairn {

namespace detail {

/// The common values under `root`: every value `common_from_pickle` decodes, keyed by its path
/// (dict keys and list indices joined with '.'); tensors and other objects are skipped.
CAIRN_INLINE result<std::vector<std::pair<std::string, common_value>>> torch_save_commons(
    const pickle::value& root, const std::string& file) {
  std::vector<std::pair<std::string, common_value>> out;
  std::vector<std::pair<std::string, const pickle::value*>> todo{{"", &root}};
  std::uint64_t path_bytes = 0;
  while (!todo.empty()) {
    auto [path, v] = std::move(todo.back());
    todo.pop_back();
    if (torch_zip::as_tensor(*v)) continue;
    if (!path.empty())
      if (auto c = common_from_pickle(*v)) {
        out.emplace_back(std::move(path), std::move(*c));
        continue;
      }
    auto child = [&](std::string name, const pickle::value& c) -> result<void> {
      std::string p = path.empty() ? std::move(name) : path + "." + name;
      path_bytes += p.size();
      if (path_bytes > torch_zip::max_found_path_bytes)
        return make_error(errc::resource, "torch.save file: its value paths exceed " +
                                              std::to_string(torch_zip::max_found_path_bytes) +
                                              " bytes")
            .with_file(file);
      todo.emplace_back(std::move(p), &c);
      return ok();
    };
    if (v->is_dict() && v->entries) {
      for (const auto& [k, c] : *v->entries)
        if (k.is_string()) CAIRN_TRY(child(k.str, c));
    } else if (v->is_sequence()) {
      const auto& xs = v->elements();
      for (std::size_t i = 0; i < xs.size(); ++i) CAIRN_TRY(child(std::to_string(i), xs[i]));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace detail

CAIRN_INLINE result<checkpoint_metadata> torch_save_as_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(std::vector<std::string> names, st.list(""));
  std::erase_if(names, [](const std::string& n) { return !format_files::is_torch_save_file(n); });
  std::sort(names.begin(), names.end());
  checkpoint_metadata m;
  m.format = "torch_save";
  m.block_size = foreign_read_block;
  m.save_id = "pt";
  m.world_size = 1;
  if (names.empty())
    return make_error(errc::not_found, "no torch.save file (*.pt, *.pth, pytorch_model*.bin) here")
        .with_file(st.describe(""));
  std::map<std::string, std::uint32_t> files;
  std::map<std::string, std::string> key_file;     // where each key was found, for errors
  std::map<std::string, std::string> common_file;  // likewise for common values
  for (const std::string& name : names) {
    const std::string where = st.describe(name);
    CAIRN_TRY_ASSIGN(torch_zip::archive a, torch_zip::open_archive(st, name));
    std::vector<std::pair<std::string, torch_zip::tensor_ref>> found;
    try {
      found = torch_zip::find_tensors(a.root);
    } catch (const exception& e) {
      return error(e.err()).with_file(where);
    }
    for (auto& [path, t] : found) {
      // A bare tensor (`torch.save(t, "w.pt")`) is keyed by the file's stem.
      std::string key = path.empty() ? name.substr(0, name.rfind('.')) : path;
      if (auto [it, fresh] = key_file.emplace(key, name); !fresh)
        return make_error(errc::corrupt,
                          "the key is in two torch.save files: " + it->second + " and " + name)
            .with_key(key)
            .with_file(where);
      if (!detail::row_major(t))
        return make_error(errc::unsupported_version,
                          "a non-contiguous view (a transposed or sliced tensor saved as it is): "
                          "load reads tensors in place; save it with .contiguous()")
            .with_key(key)
            .with_file(where);
      const std::uint64_t n = static_cast<std::uint64_t>(numel(t.dims)) * dtype_size(t.type);
      auto at = detail::archive_bytes_at(a, t, n);
      if (!at) return std::move(at).err().with_key(key).with_file(where);
      CAIRN_TRY_ASSIGN(std::uint32_t fi, detail::file_index_of(st, m, files, name));
      tensor_record r;
      r.type = t.type;
      r.global_shape = t.dims;
      r.chunks.push_back(
          chunk_record{box{shape(t.dims.size(), 0), t.dims}, extent{fi, *at, n, {}}, {}});
      m.tensors.emplace(std::move(key), std::move(r));
    }
    CAIRN_TRY_ASSIGN(auto commons, detail::torch_save_commons(a.root, where));
    for (auto& [path, c] : commons) {
      if (m.tensors.count(path)) continue;
      auto [it, fresh] = m.inline_commons.emplace(path, c);
      if (fresh) {
        common_file[path] = name;
      } else if (it->second.kind != c.kind || it->second.type != c.type ||
                 it->second.data != c.data) {
        return make_error(errc::corrupt, "the value differs between torch.save files " +
                                             common_file[path] + " and " + name)
            .with_key(path)
            .with_file(where);
      }
    }
  }
  return m;
}

}  // namespace cairn
