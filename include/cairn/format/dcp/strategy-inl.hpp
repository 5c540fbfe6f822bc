// cairn/format/dcp/strategy-inl.hpp: the bodies of cairn/format/dcp/strategy.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <any>
#include <set>

#include "cairn/format/dcp/strategy.hpp"
#include "cairn/format/torch/zip.hpp"

namespace cairn::detail {

CAIRN_INLINE torch_zip::byte_stream device_stream(const write_item& it,
                                                  cuda::staging_window& window) {
  return
      [&it, &window](
          const std::function<result<void>(std::span<const std::byte>)>& append) -> result<void> {
        const std::uint64_t piece = window.piece_bytes();
        for (std::uint64_t at = 0; at < it.nbytes; at += piece) {
          const std::size_t n = static_cast<std::size_t>(std::min(piece, it.nbytes - at));
          cuda::staging_window::slot slot = window.take();
          CAIRN_TRY(slot.from_device(0, it.src + at, n));
          CAIRN_TRY(slot.wait());
          CAIRN_TRY(append(slot.bytes().first(n)));
        }
        return ok();
      };
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> torch_dist_strategy::check(const leaf_list& leaves) const {
  for (const auto& t : leaves.tensors)
    CAIRN_TRY(dcp::check_flavor_holds(flavor_, t.sharding.type, t.sharding.key));
  return ok();
}

CAIRN_INLINE result<void> torch_dist_strategy::write(planned_save& plan,
                                                     storage_ref st,
                                                     const save_options& opt,
                                                     buffer_pool*,
                                                     written_save& out) const {
  const auto& slots = plan.index.slots[plan.rank];
  detail::dcp_write_report report;
  if (!plan.items.empty()) {
    std::string name = data_name(plan.rank, plan.save_id);
    std::string where = st.describe(name);
    CAIRN_TRY_ASSIGN(auto w, st.open_writer(name));
    std::uint64_t off = 0, total = 0;
    for (const auto& it : plan.items) total += it.nbytes;
    detail::progress_meter progress(&opt.progress, "write", total);
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
        v = {it.key, plan.index.tensors.at(slot.key).type, it.region.size,
             it.on_device
                 ? std::span<const std::byte>{}
                 : std::span<const std::byte>{it.src, static_cast<std::size_t>(it.nbytes)}};
      }
      auto len = it.on_device
                     ? torch_zip::write_tensor_item(*w, off, v, it.nbytes,
                                                    detail::device_stream(it, *plan.window), where)
                     : torch_zip::write_tensor_item(*w, off, v, where);
      if (!len) return std::move(len).err().with_key(it.key).with_file(where);
      report.items.push_back({off, *len});
      off += *len;
      progress.add(it.nbytes);
    }
    if (auto f = w->finish(); !f) return std::move(f).err().with_file(where);
    plan.stats.bytes_written += total;
    plan.stats.chunks_written = plan.items.size();
  }
  out.report = detail::encode_message(report);
  return ok();
}

CAIRN_INLINE result<void> torch_dist_strategy::commit(planned_save& plan,
                                                      written_save& w,
                                                      const std::vector<bytes>& reports,
                                                      const std::vector<bytes>&,
                                                      storage_ref st,
                                                      const save_options& opt) const {
  const save_index& index = plan.index;
  dcp::metadata m;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    CAIRN_TRY_ASSIGN(detail::dcp_write_report rep,
                     detail::decode_message<detail::dcp_write_report>(reports[r]));
    if (rep.items.size() != index.slots[r].size())
      return make_error(errc::comm, "malformed DCP write report between ranks: " +
                                        std::to_string(rep.items.size()) + " items for " +
                                        std::to_string(index.slots[r].size()) + " planned")
          .with_rank(static_cast<int>(r));
    std::string file = data_name(static_cast<int>(r), plan.save_id);
    for (std::size_t i = 0; i < rep.items.size(); ++i) {
      const write_slot& slot = index.slots[r][i];
      const auto [off, len] = rep.items[i];
      if (slot.is_object) {
        dcp::add_bytes_item(m, slot.key, {file, off, len});
        continue;
      }
      const tensor_record& rec = index.tensors.at(slot.key);
      dcp::add_tensor_chunk(m, slot.key, rec.type, rec.global_shape,
                            rec.chunks.at(slot.chunk).region, {file, off, len});
    }
  }
  // Megatron's common.pt (with the content metadata) and metadata.json, then .metadata: the
  // commit.
  w.local = true;  // abandon removes common.pt and metadata.json too
  CAIRN_TRY(dcp::write_commit_files(st, m, flavor_, plan.commons, opt.content_metadata));
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

CAIRN_INLINE void torch_dist_strategy::abandon(const planned_save& plan,
                                               const written_save& w,
                                               storage_ref st) const {
  if (!plan.items.empty()) (void)st.remove(data_name(plan.rank, plan.save_id));
  if (w.local.has_value()) {  // rank 0 got as far as the commit, in a fresh place
    (void)st.remove(megatron_common_name);
    (void)st.remove(metadata_name);
  }
}

CAIRN_INLINE result<bool> torch_dist_strategy::committed(const planned_save& plan,
                                                         const written_save&,
                                                         storage_ref st) const {
  CAIRN_TRY_ASSIGN(bool present, st.exists(dcp::metadata_name));
  if (!present) return false;
  CAIRN_TRY_ASSIGN(dcp::metadata m, dcp::read(st));
  const std::string mine = "." + plan.save_id + ".distcp";
  for (const auto& [k, v] : m.storage_data)
    if (v.relative_path.ends_with(mine)) return true;
  return m.storage_data.empty() && plan.index.tensors.empty() && plan.index.objects.empty();
}

}  // namespace cairn
