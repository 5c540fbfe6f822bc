// cairn/format/safetensors/strategy.hpp: the safetensors save strategies (`one_file`,
// `per_tensor`, `chunks`): a native save of each rank's shard, then the ranks assemble the
// whole-tensor files in place, streaming through `convert` (format/safetensors/files.hpp plans
// the files).
#pragma once

#include <algorithm>
#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/format/writers.hpp"

namespace cairn {

/// Saves tensors as safetensors, whole (consolidated) whatever the sharding:
///
/// - `one_file`: one `model.safetensors`;
/// - `per_tensor`: one `<key>.safetensors` per tensor ('/' becomes '-'), plus the index;
/// - `chunks`: `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus
///   `model.safetensors.index.json` (Hugging Face's sharded layout).
///
/// Tensor names are the checkpoint keys. Every rank first writes its chunks as a native shard
/// file (checksummed, in parallel); then the output files are shared out among the ranks by
/// size and each rank builds its files streaming, reading the boxes it needs from the shards
/// (memory bounded by `slab_bytes`); rank 0 writes the index last and removes the shards. The
/// same state gives byte-identical files. Safetensors holds tensors only: trees with sharded
/// objects or common values are rejected. File names are fixed, so a committed checkpoint is
/// never replaced in place (save to a new place). The save's content metadata goes into each
/// file's `__metadata__`.
class safetensors_strategy final : public save_strategy {
 public:
  /// `format`: one_file, per_tensor or chunks; `chunk_size`: the most tensor bytes per file of
  /// `chunks`.
  explicit safetensors_strategy(convert::output_format format = convert::output_format::one_file,
                                std::uint64_t chunk_size = 5'000'000'000,
                                std::uint64_t slab_bytes = std::uint64_t{64} << 20)
      : format_(format), chunk_size_(chunk_size), slab_bytes_(slab_bytes) {
    if (format != convert::output_format::one_file &&
        format != convert::output_format::per_tensor && format != convert::output_format::chunks)
      throw exception(make_error(errc::invalid_argument,
                                 "safetensors_strategy: the format must be one_file, per_tensor or "
                                 "chunks"));
  }
  std::string_view name() const noexcept override { return convert::format_name(format_); }
  bool can_overwrite() const noexcept override { return false; }

  result<void> check(const leaf_list& leaves) const override {
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

  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options& opt,
                     buffer_pool* buffers,
                     written_save& out) const override {
    // The shard this rank holds, with the native report that `assemble` reads (never the
    // native format's own index files: this strategy writes its own index).
    save_options shard = opt;
    shard.index_files = false;
    return native_.write(plan, st, shard, buffers, out);
  }

  bool assembles() const noexcept override { return true; }

  result<void> assemble(planned_save& plan,
                        const std::vector<bytes>& reports,
                        storage_ref st,
                        const save_options& opt,
                        written_save& out) const override {
    convert::convert_options copt = options(opt);
    CAIRN_TRY_ASSIGN(auto src,
                     convert::native_source::over(st, shards(plan, reports), opt.io_threads));
    CAIRN_TRY_ASSIGN(auto files, convert::plan_safetensors(src->tensors(), copt));
    std::vector<int> owner = owners(files, reports.size());
    auto& written = out.local.emplace<std::vector<std::string>>();  // for abandon
    convert::convert_stats stats;
    convert::slab_buffers buffers;
    std::uint64_t total = 0;
    for (std::size_t f = 0; f < files.size(); ++f)
      if (owner[f] == plan.rank) total += tensor_bytes(files[f]);
    detail::progress_meter progress(&opt.progress, "assemble", total);
    for (std::size_t f = 0; f < files.size(); ++f) {
      if (owner[f] != plan.rank) continue;
      written.push_back(files[f].name);
      CAIRN_TRY(
          convert::write_safetensors_file(*src, st, files[f], copt, stats, &progress, &buffers));
    }
    return ok();
  }

  result<void> commit(planned_save& plan,
                      written_save&,
                      const std::vector<bytes>&,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options& opt) const override {
    if (format_ != convert::output_format::one_file) {
      convert::convert_options copt = options(opt);
      std::vector<convert::tensor_entry> ts;
      for (const auto& [k, t] : plan.index.tensors) ts.push_back({k, t.type, t.global_shape});
      CAIRN_TRY_ASSIGN(auto files, convert::plan_safetensors(ts, copt));
      CAIRN_TRY_ASSIGN(safetensors::index ix, safetensors::index_of(files));
      CAIRN_TRY(safetensors::write_index(st, safetensors::index_name, ix));
    }
    for (int r = 0; r < plan.index.world_size; ++r)  // the shards
      if (plan.index.writes(r)) (void)st.remove(data_file_name(r, plan.save_id));
    return ok();
  }

  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override {
    native_.abandon(plan, w, st);
    if (const auto* names = std::any_cast<std::vector<std::string>>(&w.local))
      for (const auto& n : *names) (void)st.remove(n);
  }

  /// Committed when the index is there (`one_file` has nothing to commit after `assemble`).
  /// These formats never replace a checkpoint, so what is there is this save's.
  result<bool> committed(const planned_save&, const written_save&, storage_ref st) const override {
    if (format_ == convert::output_format::one_file) return true;
    return st.exists(safetensors::index_name);
  }

 private:
  convert::convert_options options(const save_options& opt) const {
    convert::convert_options c;
    c.format = format_;
    c.chunk_size = chunk_size_;
    c.slab_bytes = slab_bytes_;
    c.io_threads = opt.io_threads;
    for (const auto& [k, v] : opt.content_metadata) c.metadata[k] = v;
    return c;
  }
  /// The shard files as a native checkpoint (not committed anywhere: metadata in memory).
  static checkpoint_metadata shards(const planned_save& plan, const std::vector<bytes>& reports) {
    return native_strategy::metadata_of(plan.index, plan.save_id, reports);
  }
  /// The tensor bytes of a planned file.
  static std::uint64_t tensor_bytes(const safetensors::planned_file& f) {
    std::uint64_t n = 0;
    for (const auto& t : f.tensors)
      n += static_cast<std::uint64_t>(numel(t.dims)) * dtype_size(t.type);
    return n;
  }
  /// Which rank writes each output file: largest first, onto the rank with the fewest bytes.
  static std::vector<int> owners(const std::vector<safetensors::planned_file>& files,
                                 std::size_t ranks) {
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

  convert::output_format format_;
  std::uint64_t chunk_size_;
  std::uint64_t slab_bytes_;
  native_strategy native_;
};

namespace detail {
inline const bool safetensors_strategies_registered =
    register_save_strategy("one_file",
                           [] {
                             return std::unique_ptr<save_strategy>(
                                 new safetensors_strategy(convert::output_format::one_file));
                           }) &&
    register_save_strategy("per_tensor",
                           [] {
                             return std::unique_ptr<save_strategy>(
                                 new safetensors_strategy(convert::output_format::per_tensor));
                           }) &&
    register_save_strategy("chunks", [] {
      return std::unique_ptr<save_strategy>(
          new safetensors_strategy(convert::output_format::chunks));
    });
}  // namespace detail

}  // namespace cairn
