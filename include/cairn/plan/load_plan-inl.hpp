// cairn/plan/load_plan-inl.hpp: the bodies of cairn/plan/load_plan.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <map>
#include <optional>

#include "cairn/plan/box.hpp"
#include "cairn/plan/cover.hpp"
#include "cairn/plan/load_plan.hpp"

namespace cairn::detail {

CAIRN_INLINE result<void> plan_copies(const tensor_record& rec,
                                      const std::string& key,
                                      const box& dst_box,
                                      std::byte* dst,
                                      std::vector<copy_job>& jobs) {
  std::optional<box> inside;
  if (dst_box.size.empty())
    inside = dst_box;
  else
    inside = intersect(dst_box, box{shape(rec.global_shape.size(), 0), rec.global_shape});
  if (!inside) return ok();  // all padding (allow_shape_mismatch): nothing was saved there
  const std::size_t first = jobs.size();
  std::vector<box> parts;
  for (const auto& c : rec.chunks) {
    std::optional<box> x =
        dst_box.size.empty() ? std::optional<box>(c.region) : intersect(c.region, *inside);
    if (!x) continue;
    parts.push_back(*x);
    jobs.push_back(copy_job{&c, std::move(*x), dst, dst_box, dtype_size(rec.type), key, false,
                            rec.type, rec.type});
  }
  if (auto p = check_exact_cover(parts, *inside)) {
    if (p->what == cover_problem::kind::overlap) {
      // The two boxes are parts of this call's jobs (an overlap needs two of them).
      std::string a = jobs[first + p->first].chunk->region.str();
      std::string b = jobs[first + p->second].chunk->region.str();
      jobs.resize(first);
      return make_error(errc::integrity,
                        "the checkpoint's chunks " + a + " and " + b + " both hold " +
                            p->shared.str() + " (elements of " + inside->str() +
                            " this rank loads): the checkpoint is corrupt or was saved "
                            "with overlapping shards")
          .with_key(key);
    }
    // A gap may lie where no chunk is at all: it is named by the cover check's own result.
    jobs.resize(first);
    return make_error(errc::integrity,
                      (p->missing ? "no chunk of the checkpoint holds " + p->missing->str() + "; "
                                  : std::string()) +
                          "the chunks cover " + std::to_string(p->covered) + " of the " +
                          std::to_string(p->wanted) + " elements of " + inside->str() +
                          " this rank loads (it was saved with gaps, or its metadata is corrupt)")
        .with_key(key);
  }
  return ok();
}

CAIRN_INLINE std::vector<chunk_run> runs_of_chunk(const chunk_record& chunk,
                                                  const std::vector<copy_job>& jobs,
                                                  const std::vector<std::size_t>& js,
                                                  std::uint64_t& bytes_needed) {
  std::vector<chunk_run> runs;
  for (std::size_t j : js) {
    const copy_job& job = jobs[j];
    const std::uint64_t es = job.elem_size;
    for_each_run(chunk.region, job.dst_box, job.region,
                 [&](std::int64_t s, std::int64_t t, std::int64_t n) {
                   std::uint64_t lo = static_cast<std::uint64_t>(s) * es;
                   std::uint64_t hi = lo + static_cast<std::uint64_t>(n) * es;
                   bytes_needed += hi - lo;
                   runs.push_back({lo, hi,
                                   job.on_device || job.casts()
                                       ? nullptr
                                       : job.dst + static_cast<std::uint64_t>(t) * es});
                 });
  }
  std::sort(runs.begin(), runs.end(),
            [](const chunk_run& a, const chunk_run& b) { return a.lo < b.lo; });
  return runs;
}

CAIRN_INLINE direct_targets::direct_targets(const std::vector<chunk_run>& runs)
    : runs_(runs), max_hi_(runs.size()) {
  for (std::size_t i = 0; i < runs.size(); ++i)
    max_hi_[i] = std::max(runs[i].hi, i ? max_hi_[i - 1] : 0);
}

CAIRN_INLINE std::byte* direct_targets::operator()(std::uint64_t lo, std::uint64_t hi) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), lo,
                             [](std::uint64_t v, const chunk_run& r) { return v < r.lo; });
  if (it == runs_.begin()) return nullptr;
  std::size_t i = static_cast<std::size_t>(it - runs_.begin()) - 1;
  if (runs_[i].hi < hi || (i > 0 && max_hi_[i - 1] > lo) ||
      (i + 1 < runs_.size() && runs_[i + 1].lo < hi) || !runs_[i].dst)
    return nullptr;
  return runs_[i].dst + (lo - runs_[i].lo);
}

CAIRN_INLINE std::vector<std::pair<std::uint64_t, std::uint64_t>> touched_blocks(
    const std::vector<chunk_run>& runs, std::uint64_t block_size) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
  for (const chunk_run& r : runs) {
    std::pair<std::uint64_t, std::uint64_t> b{r.lo / block_size, (r.hi - 1) / block_size};
    if (!merged.empty() && b.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, b.second);
    else
      merged.push_back(b);
  }
  return merged;
}

CAIRN_INLINE void plan_chunk_reads(const chunk_record& chunk,
                                   const std::vector<chunk_run>& runs,
                                   std::size_t group,
                                   std::uint64_t block_size,
                                   std::uint64_t temp_blocks,
                                   std::uint64_t blocks_per_io,
                                   std::vector<read_op>& ops) {
  const std::uint64_t B = block_size;
  const std::uint64_t chunk_bytes = chunk.where.nbytes;
  const direct_targets direct_for(runs);
  auto add_op = [&](std::uint64_t b0, std::uint64_t b1) {
    std::uint64_t lo = b0 * B, hi = std::min(chunk_bytes, (b1 + 1) * B);
    if (std::byte* direct = direct_for(lo, hi)) {
      ops.push_back(read_op{&chunk, b0, b1, direct, group});
      return;
    }
    for (std::uint64_t b = b0; b <= b1; b += temp_blocks)
      ops.push_back(read_op{&chunk, b, std::min(b1, b + temp_blocks - 1), nullptr, group});
  };
  for (const auto& [b0, b1] : touched_blocks(runs, B)) {
    std::uint64_t first = b0, last = b1;
    if (first < last && !direct_for(first * B, (first + 1) * B)) add_op(first, first), ++first;
    bool tail = first < last && !direct_for(last * B, std::min(chunk_bytes, (last + 1) * B));
    if (tail) --last;
    for (std::uint64_t b = first; b <= last; b += blocks_per_io)
      add_op(b, std::min(last, b + blocks_per_io - 1));
    if (tail) add_op(last + 1, last + 1);
  }
}

CAIRN_INLINE read_plan plan_reads(const std::vector<copy_job>& jobs,
                                  std::uint64_t block_size,
                                  std::uint64_t buffer_bytes,
                                  std::uint64_t max_io) {
  read_plan plan;
  const std::uint64_t temp_blocks = std::max<std::uint64_t>(1, buffer_bytes / block_size);
  const std::uint64_t blocks_per_io = std::max<std::uint64_t>(1, max_io / block_size);
  std::map<const chunk_record*, std::size_t> group_of;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    auto [it, fresh] = group_of.try_emplace(jobs[j].chunk, plan.job_groups.size());
    if (fresh) plan.job_groups.emplace_back();
    plan.job_groups[it->second].push_back(j);
  }
  // Reads are issued chunk by chunk.
  for (const auto& [chunk, g] : group_of) {
    std::vector<chunk_run> runs =
        runs_of_chunk(*chunk, jobs, plan.job_groups[g], plan.bytes_needed);
    plan_chunk_reads(*chunk, runs, g, block_size, temp_blocks, blocks_per_io, plan.ops);
  }
  return plan;
}

}  // namespace cairn::detail
