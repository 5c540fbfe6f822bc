// cairn/format/safetensors/strategy-inl.hpp: the bodies of cairn/format/safetensors/strategy.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <any>

#include "cairn/format/safetensors/strategy.hpp"
#include "cairn/format/stream/source.hpp"

namespace cairn {

CAIRN_INLINE safetensors_strategy::safetensors_strategy(safetensors::file_split split,
                                                        std::uint64_t chunk_size,
                                                        std::uint64_t slab_bytes)
    : split_(split), chunk_size_(chunk_size), slab_bytes_(slab_bytes) {}

CAIRN_INLINE result<void> safetensors_strategy::check(const leaf_list& leaves) const {
  if (!leaves.objects.empty())
    return make_error(errc::invalid_argument,
                      "safetensors holds tensors only: save sharded objects with the "
                      "native or torch_dist strategy, or leave them out of this tree")
        .with_key(leaves.objects.front().key);
  if (!leaves.commons.empty())
    return make_error(errc::invalid_argument,
                      "safetensors holds tensors only: save common values with the "
                      "native or torch_dist strategy (or as content_metadata), or "
                      "leave them out of this tree")
        .with_key(leaves.commons.front().path);
  return ok();
}

CAIRN_INLINE result<void> safetensors_strategy::write(planned_save& plan,
                                                      storage_ref st,
                                                      const save_options& opt,
                                                      buffer_pool* buffers,
                                                      written_save& out) const {
  // The shard this rank holds, with the native report that `assemble` reads (never the
  // native format's own index files: this strategy writes its own index).
  save_options shard = opt;
  shard.index_files = false;
  return native_.write(plan, st, shard, buffers, out);
}

CAIRN_INLINE result<void> safetensors_strategy::assemble(planned_save& plan,
                                                         const std::vector<bytes>& reports,
                                                         storage_ref st,
                                                         const save_options& opt,
                                                         written_save& out) const {
  const safetensors::write_settings ws = layout(opt);
  const stream::stream_settings settings{std::nullopt, slab_bytes_, opt.io_threads};
  CAIRN_TRY_ASSIGN(auto src,
                   stream::catalog_source::over(st, shards(plan, reports), opt.io_threads));
  CAIRN_TRY_ASSIGN(auto files, safetensors::plan_streamed_files(src->tensors(), ws, std::nullopt));
  std::vector<int> owner = owners(files, reports.size());
  auto& written = out.local.emplace<std::vector<std::string>>();  // for abandon
  stream::stream_stats stats;
  stream::slab_buffers buffers;
  std::uint64_t total = 0;
  for (std::size_t f = 0; f < files.size(); ++f)
    if (owner[f] == plan.rank) total += tensor_bytes(files[f]);
  detail::progress_meter progress(&opt.progress, "assemble", total);
  for (std::size_t f = 0; f < files.size(); ++f) {
    if (owner[f] != plan.rank) continue;
    written.push_back(files[f].name);
    CAIRN_TRY(safetensors::write_streamed_file(*src, st, files[f], ws.metadata, settings, stats,
                                               &progress, &buffers));
  }
  return ok();
}

CAIRN_INLINE result<void> safetensors_strategy::commit(planned_save& plan,
                                                       written_save&,
                                                       const std::vector<bytes>&,
                                                       const std::vector<bytes>&,
                                                       storage_ref st,
                                                       const save_options& opt) const {
  if (split_ != safetensors::file_split::one_file) {
    std::vector<stream::tensor_entry> ts;
    for (const auto& [k, t] : plan.index.tensors) ts.push_back({k, t.type, t.global_shape});
    CAIRN_TRY_ASSIGN(auto files, safetensors::plan_streamed_files(ts, layout(opt), std::nullopt));
    CAIRN_TRY_ASSIGN(safetensors::index ix, safetensors::index_of(files));
    CAIRN_TRY(safetensors::write_index(st, safetensors::index_name, ix));
  }
  for (int r = 0; r < plan.index.world_size; ++r)  // the shards
    if (plan.index.writes(r)) (void)st.remove(data_file_name(r, plan.save_id));
  return ok();
}

CAIRN_INLINE void safetensors_strategy::abandon(const planned_save& plan,
                                                const written_save& w,
                                                storage_ref st) const {
  native_.abandon(plan, w, st);
  if (const auto* names = std::any_cast<std::vector<std::string>>(&w.local))
    for (const auto& n : *names) (void)st.remove(n);
}

CAIRN_INLINE result<bool> safetensors_strategy::committed(const planned_save&,
                                                          const written_save&,
                                                          storage_ref st) const {
  if (split_ == safetensors::file_split::one_file) return true;
  return st.exists(safetensors::index_name);
}

CAIRN_INLINE safetensors::write_settings safetensors_strategy::layout(
    const save_options& opt) const {
  safetensors::write_settings ws;
  ws.split = split_;
  ws.chunk_size = chunk_size_;
  for (const auto& [k, v] : opt.content_metadata) ws.metadata[k] = v;
  return ws;
}

CAIRN_INLINE std::uint64_t safetensors_strategy::tensor_bytes(const safetensors::planned_file& f) {
  std::uint64_t n = 0;
  for (const auto& t : f.tensors)
    n += static_cast<std::uint64_t>(numel(t.dims)) * dtype_size(t.type);
  return n;
}

CAIRN_INLINE std::vector<int> safetensors_strategy::owners(
    const std::vector<safetensors::planned_file>& files, std::size_t ranks) {
  std::vector<std::size_t> order(files.size());
  std::vector<std::uint64_t> size(files.size()), load(std::max<std::size_t>(ranks, 1));
  for (std::size_t f = 0; f < files.size(); ++f) {
    order[f] = f;
    size[f] = tensor_bytes(files[f]);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return size[a] > size[b]; });
  std::vector<int> owner(files.size(), 0);
  for (std::size_t f : order) {
    auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = r;
    load[static_cast<std::size_t>(r)] += size[f];
  }
  return owner;
}

}  // namespace cairn
