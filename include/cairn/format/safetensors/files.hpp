// cairn/format/safetensors/files.hpp: how a set of tensors is spread over safetensors files:
// one `model.safetensors`, one file per tensor, or Hugging Face's numbered files of at most a
// given size with `model.safetensors.index.json`. Pure functions of the tensor list, shared by
// `convert`/`unshard` and the safetensors save strategies.
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/format/safetensors/file.hpp"

namespace cairn::safetensors {

/// How tensors are spread over files.
enum class file_split {
  one_file,    ///< one `model.safetensors`
  per_tensor,  ///< one `<key>.safetensors` per tensor ('/' becomes '-'), plus the index
  chunks,      ///< `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus the index
};

/// The file of tensor `key` under `file_split::per_tensor`.
inline std::string per_tensor_name(std::string_view key) {
  std::string f(key);
  for (char& c : f)
    if (c == '/') c = '-';
  return f + ".safetensors";
}

/// The name of file `i` (from 0) of `n` under `file_split::chunks`.
inline std::string chunk_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

/// One output file: its name and the tensors it holds, in the order they were given.
struct planned_file {
  std::string name;
  std::vector<tensor_decl> tensors;
};

/// Spreads `all` over files as `split` says; `chunk_size` bounds the tensor bytes of a
/// `chunks` file (a larger tensor gets a file of its own). Deterministic for a tensor list.
/// Fails when two keys map to one per-tensor file name, or `chunk_size` is 0.
inline result<std::vector<planned_file>> plan_files(const std::vector<tensor_decl>& all,
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

/// The Hugging Face index of `files` (computed from the plan, not from files on storage).
inline result<index> index_of(const std::vector<planned_file>& files) {
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
