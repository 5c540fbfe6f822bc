// cairn/format/safetensors/files-inl.hpp: the bodies of cairn/format/safetensors/files.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cstdio>
#include <set>

#include "cairn/format/safetensors/files.hpp"

namespace cairn::safetensors {

CAIRN_INLINE std::string per_tensor_name(std::string_view key) {
  std::string f(key);
  for (char& c : f)
    if (c == '/') c = '-';
  return f + ".safetensors";
}

CAIRN_INLINE std::string chunk_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

CAIRN_INLINE result<std::vector<planned_file>> plan_files(const std::vector<tensor_decl>& all,
                                                          file_split split,
                                                          std::uint64_t chunk_size) {
  std::vector<planned_file> files;
  if (split == file_split::one_file) {
    files.push_back({"model.safetensors", all});
  } else if (split == file_split::per_tensor) {
    std::set<std::string> seen;
    for (const auto& t : all) {
      std::string f = per_tensor_name(t.name);
      if (!seen.insert(f).second || f == index_name)
        return make_error(errc::invalid_argument, "per_tensor: two keys map to the file name " + f)
            .with_key(t.name);
      files.push_back({std::move(f), {t}});
    }
  } else {
    if (chunk_size == 0) return make_error(errc::invalid_argument, "chunk size is 0");
    std::uint64_t cur = 0;
    for (const auto& t : all) {
      bool ok_size = true;
      std::uint64_t b = detail::checked_nbytes(t.dims, t.type, ok_size);
      if (!ok_size)
        return make_error(errc::invalid_argument, "tensor too large for safetensors")
            .with_key(t.name);
      if (files.empty() || (cur > 0 && cur + b > chunk_size)) {
        files.push_back({});
        cur = 0;
      }
      files.back().tensors.push_back(t);
      cur += b;
    }
    for (std::size_t i = 0; i < files.size(); ++i) files[i].name = chunk_name(i, files.size());
  }
  return files;
}

CAIRN_INLINE result<index> index_of(const std::vector<planned_file>& files) {
  index ix;
  for (const auto& f : files) {
    CAIRN_TRY_ASSIGN(header h, plan(f.tensors));
    for (const auto& info : h.tensors) {
      ix.weight_map[info.name] = f.name;
      ix.total_size += info.nbytes();
    }
  }
  return ix;
}

}  // namespace cairn::safetensors
