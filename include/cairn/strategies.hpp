// cairn/strategies.hpp: save strategies besides the native format: `torch_dist` (PyTorch
// Distributed Checkpoint + Megatron's files) and the safetensors layouts (`one_file`,
// `per_tensor`, `chunks`). `load` reads all of them back on any number of ranks.
#pragma once

#include <algorithm>
#include <any>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/foreign.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/save.hpp"

namespace cairn {

/// Saves in the PyTorch Distributed Checkpoint layout that Megatron-core's `torch_dist` backend
/// also uses, so `torch.distributed.checkpoint.load` and Megatron load it:
///
/// - every rank writes `__<rank>_0.<save id>.distcp`: one `torch.save` archive per chunk it
///   writes (chunks are N-d boxes, so flattened optimizer slices become the boxes they cover);
/// - sharded objects become DCP bytes items named by their unique key (`rng/shard_0_4`), each
///   a `torch.save` of a uint8 tensor of the object's encoded bytes;
/// - rank 0 writes Megatron's `common.pt` (common values as Python values) and
///   `metadata.json`, and `.metadata` last: the commit.
///
/// A committed checkpoint is never replaced in place: `common.pt` has a fixed name, so a save
/// over a committed checkpoint could leave one generation's `.metadata` beside another's common
/// values. Save every checkpoint to a new place, as Megatron does. DCP has no checksums: `load`
/// reads this layout unverified.
class torch_dist_strategy final : public save_strategy {
 public:
  /// `f`: which torch module paths `.metadata` names (torch 2.x, or 1.13's prototype).
  explicit torch_dist_strategy(dcp::flavor f = dcp::flavor::torch2) : flavor_(f) {}
  std::string_view name() const noexcept override { return "torch_dist"; }
  bool can_overwrite() const noexcept override { return false; }

  /// The data file of `rank` for a save id.
  static std::string data_name(int rank, const std::string& save_id) {
    return "__" + std::to_string(rank) + "_0." + save_id + ".distcp";
  }

  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options&,
                     buffer_pool*,
                     written_save& out) const override {
    const auto& slots = plan.index.slots[plan.rank];
    detail::binary_writer report;
    if (!plan.items.empty()) {
      std::string name = data_name(plan.rank, plan.save_id);
      std::string where = st.describe(name);
      CAIRN_TRY_ASSIGN(auto w, st.open_writer(name));
      std::uint64_t off = 0;
      for (std::size_t i = 0; i < plan.items.size(); ++i) {
        const write_item& it = plan.items[i];
        const write_slot& slot = slots[i];
        torch_zip::tensor_view v;
        if (slot.is_object) {
          v = {slot.key,
               dtype::u8,
               shape{static_cast<std::int64_t>(it.nbytes)},
               {it.src, static_cast<std::size_t>(it.nbytes)}};
        } else {
          v = {it.key,
               plan.index.tensors.at(slot.key).type,
               it.region.size,
               {it.src, static_cast<std::size_t>(it.nbytes)}};
        }
        auto len = torch_zip::write_tensor_item(*w, off, v, where);
        if (!len) return std::move(len).err().with_key(it.key).with_file(where);
        report.u64(off);
        report.u64(*len);
        off += *len;
        plan.stats.bytes_written += it.nbytes;
      }
      if (auto f = w->finish(); !f) return std::move(f).err().with_file(where);
      plan.stats.chunks_written = plan.items.size();
    }
    out.report = std::move(report.data());
    return ok();
  }

  result<void> commit(planned_save& plan,
                      written_save& w,
                      const std::vector<bytes>& reports,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options&) const override {
    const save_index& index = plan.index;
    dcp::metadata m;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      detail::binary_reader rd(reports[r]);
      std::string file = data_name(static_cast<int>(r), plan.save_id);
      for (const write_slot& slot : index.slots[r]) {
        std::uint64_t off = rd.u64(), len = rd.u64();
        if (slot.is_object) {
          m.state_dict_metadata[slot.key] = dcp::bytes_meta{};
          m.storage_data.push_back({{slot.key, std::nullopt, 0}, {file, off, len}});
          continue;
        }
        const tensor_record& rec = index.tensors.at(slot.key);
        convert::detail::add_dcp_chunk(m, slot.key, rec.type, rec.global_shape,
                                       rec.chunks.at(slot.chunk).region, {file, off, len});
      }
    }
    // Megatron's common.pt and metadata.json, then .metadata: the commit.
    w.local = true;  // abandon removes common.pt and metadata.json too
    if (!plan.commons.empty()) CAIRN_TRY(convert::detail::put_common_pt(st, plan.commons));
    if (auto p = st.put(metadata_name,
                        std::as_bytes(std::span(convert::detail::megatron_metadata_json)));
        !p)
      return std::move(p).err().with_file(st.describe(metadata_name));
    CAIRN_TRY_ASSIGN(std::string dcp_bytes, dcp::encode(m, flavor_));
    CAIRN_TRY(detail::put_checked(st, dcp::metadata_name, std::as_bytes(std::span(dcp_bytes))));
    // Data files of a checkpoint this one replaced.
    if (auto names = st.list("")) {
      std::set<std::string> referenced;
      for (const auto& [k, v] : m.storage_data) referenced.insert(v.relative_path);
      for (const auto& n : *names)
        if (n.find('/') == std::string::npos && n.rfind("__", 0) == 0 && n.size() > 7 &&
            n.substr(n.size() - 7) == ".distcp" && !referenced.count(n))
          (void)st.remove(n);
    }
    return ok();
  }

  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override {
    if (!plan.items.empty()) (void)st.remove(data_name(plan.rank, plan.save_id));
    if (w.local.has_value()) {  // rank 0 got as far as the commit, in a fresh place
      (void)st.remove("common.pt");
      (void)st.remove(metadata_name);
    }
  }

  /// Committed when `.metadata` is there and names this save's data files.
  result<bool> committed(const planned_save& plan,
                         const written_save&,
                         storage_ref st) const override {
    CAIRN_TRY_ASSIGN(bool present, st.exists(dcp::metadata_name));
    if (!present) return false;
    CAIRN_TRY_ASSIGN(dcp::metadata m, dcp::read(st));
    const std::string mine = "." + plan.save_id + ".distcp";
    for (const auto& [k, v] : m.storage_data)
      if (v.relative_path.ends_with(mine)) return true;
    return m.storage_data.empty() && plan.index.tensors.empty() && plan.index.objects.empty();
  }

 private:
  dcp::flavor flavor_;
};

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
  /// `layout`: one_file, per_tensor or chunks; `chunk_size`: the most tensor bytes per file of
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
    return native_.write(plan, st, opt, buffers, out);  // the shard this rank holds
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
    CAIRN_TRY_ASSIGN(auto files, convert::detail::safetensors_files(src->tensors(), copt));
    std::vector<int> owner = owners(files, reports.size());
    auto& written = out.local.emplace<std::vector<std::string>>();  // for abandon
    convert::convert_stats stats;
    convert::detail::slab_buffers buffers;
    for (std::size_t f = 0; f < files.size(); ++f) {
      if (owner[f] != plan.rank) continue;
      written.push_back(files[f].first);
      CAIRN_TRY(convert::detail::write_safetensors_file(*src, st, files[f].first, files[f].second,
                                                        copt, stats, 0, &buffers));
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
      CAIRN_TRY_ASSIGN(auto files, convert::detail::safetensors_files(ts, copt));
      CAIRN_TRY_ASSIGN(safetensors::index ix, convert::detail::safetensors_index(files, copt));
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
  /// These layouts never replace a checkpoint, so what is there is this save's.
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
  /// Which rank writes each output file: largest first, onto the rank with the fewest bytes.
  static std::vector<int> owners(
      const std::vector<std::pair<std::string, std::vector<const convert::tensor_entry*>>>& files,
      std::size_t ranks) {
    std::vector<std::size_t> order(files.size());
    std::vector<std::uint64_t> size(files.size()), load(std::max<std::size_t>(ranks, 1));
    for (std::size_t f = 0; f < files.size(); ++f) {
      order[f] = f;
      for (const auto* t : files[f].second) size[f] += t->nbytes();
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

}  // namespace cairn
