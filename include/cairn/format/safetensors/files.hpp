// cairn/format/safetensors/files.hpp: how a set of tensors is spread over safetensors files:
// one `model.safetensors`, one file per tensor, or Hugging Face's numbered files of at most a
// given size with `model.safetensors.index.json`. Pure functions of the tensor list, shared by
// `convert`/`unshard` and the safetensors save strategies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/safetensors/file.hpp"

namespace cairn::safetensors {

/// How tensors are spread over files.
enum class file_split {
  one_file,    ///< one `model.safetensors`
  per_tensor,  ///< one `<key>.safetensors` per tensor ('/' becomes '-'), plus the index
  chunks,      ///< `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus the index
};

/// The split's name, which is also its save strategy's and `cairn convert --format`'s.
constexpr std::string_view split_name(file_split s) noexcept {
  switch (s) {
    case file_split::one_file:
      return "one_file";
    case file_split::per_tensor:
      return "per_tensor";
    case file_split::chunks:
      return "chunks";
  }
  return "?";
}

/// The file of tensor `key` under `file_split::per_tensor`.
CAIRN_INLINE std::string per_tensor_name(std::string_view key);

/// The name of file `i` (from 0) of `n` under `file_split::chunks`.
CAIRN_INLINE std::string chunk_name(std::size_t i, std::size_t n);

/// One output file: its name and the tensors it holds, in the order they were given.
struct planned_file {
  std::string name;
  std::vector<tensor_decl> tensors;
};

/// Spreads `all` over files as `split` says; `chunk_size` bounds the tensor bytes of a
/// `chunks` file (a larger tensor gets a file of its own). Deterministic for a tensor list.
/// Fails when two keys map to one per-tensor file name, or `chunk_size` is 0.
CAIRN_INLINE result<std::vector<planned_file>> plan_files(const std::vector<tensor_decl>& all,
                                                          file_split split,
                                                          std::uint64_t chunk_size);

/// The Hugging Face index of `files` (computed from the plan, not from files on storage).
CAIRN_INLINE result<index> index_of(const std::vector<planned_file>& files);

}  // namespace cairn::safetensors

#if CAIRN_HEADER_ONLY
#  include "cairn/format/safetensors/files-inl.hpp"
#endif
