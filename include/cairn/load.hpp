// cairn/load.hpp: loading a checkpoint into a state tree of any topology (`load`, `try_load`),
// and reading parts of a checkpoint without a tree (`load_common`, `load_tensors`). The phases
// live in cairn/pipeline/load.hpp, the planners in cairn/plan/.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/options.hpp"
#include "cairn/pipeline/load.hpp"
#include "cairn/plan/load_plan.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/visit.hpp"

namespace cairn {

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

/// Reads only the common values of a checkpoint of any format (no tensors), by path. A foreign
/// format's values come as Python holds them (I64, F64, BOOL, strings).
inline result<std::map<std::string, common_value>> load_common(storage_ref st) {
  return detail::catch_all("load_common", [&]() -> result<std::map<std::string, common_value>> {
    CAIRN_TRY_ASSIGN(auto m, read_any_metadata(st));
    return read_commons(st, m);
  });
}

/// Reads the named tensors whole (any saved sharding, any format: native, torch_dist,
/// safetensors when their readers are in the program), on one process. An empty `keys` reads
/// every tensor. `progress` is told the bytes read ("read").
inline result<std::map<std::string, tensor_data>> load_tensors(
    storage_ref st,
    std::vector<std::string> keys = {},
    int threads = 2,
    const progress_callback& progress = {}) {
  return detail::catch_all("load_tensors", [&]() -> result<std::map<std::string, tensor_data>> {
    CAIRN_TRY_ASSIGN(auto m, read_any_metadata(st));
    if (keys.empty())
      for (const auto& [k, t] : m.tensors) keys.push_back(k);
    std::map<std::string, tensor_data> out;
    // Plan first: memory is sized by what the metadata claims, so the claim is checked before
    // anything is allocated (chunks that tile every tensor exactly, files as large as said).
    std::vector<detail::copy_job> jobs;
    std::map<std::string, std::pair<std::size_t, std::size_t>> job_range;  // key -> [first, end)
    std::set<std::uint32_t> files;
    for (const auto& k : keys) {
      auto it = m.tensors.find(k);
      if (it == m.tensors.end())
        return make_error(errc::not_found, "tensor is not in the checkpoint").with_key(k);
      if (job_range.count(k)) continue;
      const tensor_record& rec = it->second;
      std::size_t first = jobs.size();
      CAIRN_TRY(detail::plan_copies(
          rec, k, box{shape(rec.global_shape.size(), 0), rec.global_shape}, nullptr, jobs));
      job_range[k] = {first, jobs.size()};
      for (std::size_t j = first; j < jobs.size(); ++j) files.insert(jobs[j].chunk->where.file);
    }
    for (std::uint32_t f : files) CAIRN_TRY(check_file_holds(st, m, f));
    for (const auto& [k, range] : job_range) {
      const tensor_record& rec = m.tensors.at(k);
      tensor_data& d = out[k];
      d.type = rec.type;
      d.global_shape = rec.global_shape;
      d.data.resize(rec.nbytes());
      for (std::size_t j = range.first; j < range.second; ++j) jobs[j].dst = d.data.data();
    }
    load_stats stats;
    CAIRN_TRY(detail::run_copies(st, m, jobs, threads, stats, nullptr, &progress));
    return out;
  });
}

}  // namespace cairn
