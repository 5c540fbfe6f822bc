// cairn/load-inl.hpp: the bodies of cairn/load.hpp (included by it when header-only; compiled once
// into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <set>

#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/load.hpp"
#include "cairn/pipeline/load.hpp"
#include "cairn/plan/load_plan.hpp"

namespace cairn {

CAIRN_INLINE result<std::map<std::string, common_value>> load_common(storage_ref st) {
  return detail::catch_all("load_common", [&]() -> result<std::map<std::string, common_value>> {
    CAIRN_TRY_ASSIGN(auto m, read_any_manifest(st));  // no index file: commons only
    return read_commons(st, m);
  });
}

CAIRN_INLINE result<std::map<std::string, tensor_data>> load_tensors(
    storage_ref st, std::vector<std::string> keys, int threads, const progress_callback& progress) {
  return detail::catch_all("load_tensors", [&]() -> result<std::map<std::string, tensor_data>> {
    CAIRN_TRY_ASSIGN(auto m, read_any_manifest(st));
    if (keys.empty())
      for (const auto& [k, t] : m.tensors) keys.push_back(k);
    // The index of the keys asked for, and of nothing else.
    index_wants wants;
    for (const auto& k : keys)
      if (m.index_refs.count(k)) wants[k];
    if (!wants.empty()) CAIRN_TRY(read_index_sections(st, m, wants));
    std::map<std::string, tensor_data> out;
    // Plan first: memory is sized by what the metadata claims, so the claim is checked before
    // anything is allocated (chunks that tile every tensor exactly, files as large as said).
    std::vector<detail::copy_job> jobs;
    std::map<std::string, std::pair<std::size_t, std::size_t>> job_range;  // key -> [first, end)
    std::set<std::uint32_t> files;
    for (const auto& k : keys) {
      auto it = m.tensors.find(k);
      if (it == m.tensors.end())
        return make_error(errc::not_found, "tensor is not in the checkpoint")
            .with_key(k)
            .with_file(st.describe(""));
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
    read_counts counts;
    CAIRN_TRY(detail::run_copies(st, m, jobs, threads, counts, nullptr, &progress));
    return out;
  });
}

}  // namespace cairn
