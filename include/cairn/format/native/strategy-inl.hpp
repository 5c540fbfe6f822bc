// cairn/format/native/strategy-inl.hpp: the bodies of cairn/format/native/strategy.hpp (included by
// it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <any>
#include <map>

#include "cairn/format/native/reader.hpp"
#include "cairn/format/native/strategy.hpp"

namespace cairn {

CAIRN_INLINE result<void> native_strategy::write(planned_save& plan,
                                                 storage_ref st,
                                                 const save_options& opt,
                                                 buffer_pool* buffers,
                                                 written_save& out) const {
  const int rank = plan.rank;
  const save_index& index = plan.index;
  std::uint64_t file_size = 0;
  if (index.writes(rank)) {
    const std::string name = data_file_name(rank, plan.save_id);
    std::uint64_t total = 0;
    for (const auto& it : plan.items) total += it.nbytes;
    detail::progress_meter progress(&opt.progress, "write", total);
    CAIRN_TRY(detail::write_items(st, name, plan.items, opt.block_size, opt.io_threads, buffers,
                                  opt.zstd_level, &file_size, &progress, plan.window));
    plan.stats.bytes_written += total;
    plan.stats.chunks_written = plan.items.size();
  }
  written_state state;
  state.file_size = file_size;
  if (rank == 0 && !plan.commons.empty()) {
    CAIRN_TRY_ASSIGN(state.common, write_common_state(st, common_file_name(plan.save_id),
                                                      plan.commons, opt.block_size));
  }
  out.local = std::move(state);
  if (opt.index_files) return ok();  // the report is made by receive_routed
  detail::native_write_report report;
  if (index.partial) report.part = part_of(index, rank);
  report.compressed = opt.zstd_level > 0;
  report.file_size = file_size;
  report.items.reserve(plan.items.size());
  for (const auto& it : plan.items) {
    detail::written_item& w = report.items.emplace_back();
    w.checksums = it.checksums;
    if (report.compressed)
      w.compressed =
          detail::compressed_placement{it.file_offset, it.block_offsets, it.block_stored};
  }
  out.report = detail::encode_message(report);
  return ok();
}

CAIRN_INLINE std::vector<bytes> native_strategy::route(const planned_save& plan,
                                                       const written_save&,
                                                       const save_options&) const {
  const int world = plan.index.world_size;
  std::map<std::string, tensor_record> mine;
  const auto& slots = plan.index.slots.at(static_cast<std::size_t>(plan.rank));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const write_slot& s = slots[i];
    if (s.is_object) continue;
    const tensor_record& t = plan.index.tensors.at(s.key);
    auto [at, fresh] = mine.try_emplace(s.key, tensor_record{t.type, t.global_shape, {}});
    chunk_record c = t.chunks.at(s.chunk);
    c.where = written_extent(c.where, plan.items.at(i));
    at->second.chunks.push_back(std::move(c));
  }
  std::vector<detail::routed_sections> to(static_cast<std::size_t>(world));
  for (const auto& [key, t] : mine) {
    bytes section;
    append_index_section(section, key, t);
    to[static_cast<std::size_t>(owner_of(key, world))].sections.push_back(std::move(section));
  }
  std::vector<bytes> out;
  for (const auto& m : to) out.push_back(m.sections.empty() ? bytes{} : detail::encode_message(m));
  return out;
}

CAIRN_INLINE result<void> native_strategy::receive_routed(planned_save& plan,
                                                          const std::vector<bytes>& routed,
                                                          storage_ref st,
                                                          const save_options& opt,
                                                          written_save& out) const {
  const int rank = plan.rank;
  std::map<std::string, tensor_record> owned;
  for (std::size_t r = 0; r < routed.size(); ++r) {
    const std::string from = "the index records of rank " + std::to_string(r);
    if (routed[r].empty()) continue;
    result<detail::routed_sections> got =
        detail::decode_message<detail::routed_sections>(routed[r]);
    if (!got) return std::move(got).err().with_rank(static_cast<int>(r));
    for (const bytes& section : got->sections) {
      CAIRN_TRY_ASSIGN(auto kt, detail::index_section_reader(section, from, 0,
                                                             plan.index.block_size, routed.size())
                                    .read());
      auto [at, fresh] =
          owned.try_emplace(kt.first, tensor_record{kt.second.type, kt.second.global_shape, {}});
      if (!fresh &&
          (at->second.type != kt.second.type || at->second.global_shape != kt.second.global_shape))
        return make_error(errc::mismatch, "ranks disagree on the dtype or shape of a tensor")
            .with_key(at->first);
      for (auto& c : kt.second.chunks) at->second.chunks.push_back(std::move(c));
    }
  }
  auto& state = std::any_cast<written_state&>(out.local);
  detail::native_index_report rep;
  rep.writes = plan.index.writes(rank);
  rep.data_size = opt.zstd_level > 0 ? state.file_size : plan.index.bytes_of_rank.at(rank);
  // This rank's objects, with their checksums.
  const auto& slots = plan.index.slots.at(static_cast<std::size_t>(rank));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].is_object) continue;
    const object_record& o = plan.index.objects.at(slots[i].key);
    rep.objects.push_back(detail::reported_object{slots[i].key, o.key, o.global_shape,
                                                  o.global_offset,
                                                  written_extent(o.where, plan.items.at(i))});
  }
  if (!owned.empty()) {
    index_file_builder b;
    for (auto& [key, t] : owned) {
      std::sort(t.chunks.begin(), t.chunks.end(), [](const chunk_record& x, const chunk_record& y) {
        return x.region.offset < y.region.offset;
      });
      b.add(key, t);
    }
    built_index_file built = b.finish();
    CAIRN_TRY(put_checked(st, index_file_name(rank, plan.save_id), built.file));
    state.index_written = true;
    detail::reported_index_file& f = rep.index.emplace();
    f.size = built.file.size();
    f.checksum = built.checksum;
    for (const auto& d : built.directories) {
      const tensor_record& t = owned.at(d.key);
      f.sections.push_back(detail::reported_section{d.key, t.type, t.global_shape, d.offset,
                                                    d.length, d.checksum, t.chunks.size()});
    }
  }
  out.report = detail::encode_message(rep);
  return ok();
}

CAIRN_INLINE result<void> native_strategy::commit(planned_save& plan,
                                                  written_save& w,
                                                  const std::vector<bytes>& reports,
                                                  const std::vector<bytes>&,
                                                  storage_ref st,
                                                  const save_options& opt) const {
  checkpoint_metadata m = opt.index_files ? manifest_of(plan.index, plan.save_id, reports)
                                          : metadata_of(plan.index, plan.save_id, reports);
  m.content_metadata = opt.content_metadata;
  if (const auto* state = std::any_cast<written_state>(&w.local); state && state->common)
    add_common_state(m, *state->common);  // a copy: abandon still needs its name
  CAIRN_TRY(put_metadata(st, m));
  detail::remove_unreferenced(st, m);
  return ok();
}

CAIRN_INLINE checkpoint_metadata native_strategy::metadata_of(const save_index& index,
                                                              const std::string& save_id,
                                                              const std::vector<bytes>& reports) {
  if (!index.partial) return metadata_of_whole(index, save_id, reports);
  // Scalable planning: every rank's report begins with its part of the index.
  save_index whole;
  whole.world_size = index.world_size;
  whole.block_size = index.block_size;
  whole.slots.resize(static_cast<std::size_t>(index.world_size));
  whole.bytes_of_rank.assign(static_cast<std::size_t>(index.world_size), 0);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    result<detail::native_write_report> rep =
        detail::decode_message<detail::native_write_report>(reports[r]);
    if (!rep) throw exception(std::move(rep).err().with_rank(static_cast<int>(r)));
    if (rep->part) merge_part(*rep->part, static_cast<int>(r), whole);
  }
  return metadata_of_whole(whole, save_id, reports);
}

CAIRN_INLINE checkpoint_metadata native_strategy::manifest_of(const save_index& index,
                                                              const std::string& save_id,
                                                              const std::vector<bytes>& reports) {
  checkpoint_metadata m = empty_metadata(index, save_id);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const int rank = static_cast<int>(r);
    result<detail::native_index_report> got =
        detail::decode_message<detail::native_index_report>(reports[r]);
    if (!got) throw exception(std::move(got).err().with_rank(rank));
    detail::native_index_report& rep = *got;
    const auto data_file = static_cast<std::uint32_t>(m.files.size());
    if (rep.writes)
      m.files.push_back(file_record{data_file_name(rank, save_id), rank, rep.data_size});
    for (detail::reported_object& ro : rep.objects) {
      object_record o{std::move(ro.key), std::move(ro.global_shape), std::move(ro.global_offset),
                      std::move(ro.where)};
      o.where.file = data_file;
      m.objects.emplace(std::move(ro.unique_key), std::move(o));
    }
    if (!rep.index) continue;  // owns no tensor
    const auto index_file = static_cast<std::uint32_t>(m.files.size());
    file_record f{index_file_name(rank, save_id), rank, rep.index->size, file_role::index};
    f.checksum = rep.index->checksum;
    m.files.push_back(std::move(f));
    for (detail::reported_section& sec : rep.index->sections) {
      tensor_record t;
      t.type = sec.type;
      t.global_shape = std::move(sec.global_shape);
      m.tensors.emplace(sec.key, std::move(t));
      m.index_refs.emplace(std::move(sec.key),
                           index_ref{index_file, sec.offset, sec.length, sec.checksum, sec.chunks});
    }
  }
  m.version = required_version(m);
  return m;
}

CAIRN_INLINE detail::index_part_message native_strategy::part_of(const save_index& index,
                                                                 int rank) {
  detail::index_part_message part;
  const auto& slots = index.slots.at(static_cast<std::size_t>(rank));
  part.bytes_of_rank = index.bytes_of_rank.at(static_cast<std::size_t>(rank));
  part.slots.reserve(slots.size());
  for (const write_slot& s : slots) {
    if (s.is_object) {
      const object_record& o = index.objects.at(s.key);
      part.slots.emplace_back(detail::part_object{s.key, o.key, o.global_shape, o.global_offset,
                                                  o.where.byte_offset, o.where.nbytes});
      continue;
    }
    const tensor_record& t = index.tensors.at(s.key);
    const chunk_record& c = t.chunks.at(s.chunk);
    part.slots.emplace_back(detail::part_chunk{s.key, t.type, t.global_shape, c.region, c.tiles,
                                               c.where.byte_offset, c.where.nbytes});
  }
  return part;
}

CAIRN_INLINE void native_strategy::merge_part(const detail::index_part_message& part,
                                              int rank,
                                              save_index& whole) {
  auto r = static_cast<std::size_t>(rank);
  whole.bytes_of_rank.at(r) = part.bytes_of_rank;
  auto file = static_cast<std::uint32_t>(rank);
  for (const auto& slot : part.slots) {
    write_slot s;
    if (const auto* po = std::get_if<detail::part_object>(&slot)) {
      s.is_object = true;
      s.key = po->unique_key;
      whole.objects[s.key] = object_record{po->key, po->global_shape, po->global_offset,
                                           extent{file, po->byte_offset, po->nbytes, {}}};
    } else {
      const auto& pc = std::get<detail::part_chunk>(slot);
      s.key = pc.key;
      tensor_record& t = whole.tensors[s.key];
      t.type = pc.type;
      t.global_shape = pc.global_shape;
      t.chunks.push_back(
          chunk_record{pc.region, extent{file, pc.byte_offset, pc.nbytes, {}}, pc.tiles});
      s.chunk = t.chunks.size() - 1;
    }
    whole.slots[r].push_back(std::move(s));
  }
}

CAIRN_INLINE checkpoint_metadata native_strategy::empty_metadata(const save_index& index,
                                                                 const std::string& save_id) {
  checkpoint_metadata m;
  m.world_size = index.world_size;
  m.save_id = save_id;
  m.block_size = index.block_size;
  return m;
}

CAIRN_INLINE extent native_strategy::written_extent(const extent& planned, const write_item& it) {
  extent e = planned;
  e.byte_offset = it.file_offset;
  e.checksums = it.checksums;
  e.block_offsets = it.block_offsets;
  e.block_stored = it.block_stored;
  return e;
}

CAIRN_INLINE checkpoint_metadata native_strategy::metadata_of_whole(
    const save_index& index, const std::string& save_id, const std::vector<bytes>& reports) {
  checkpoint_metadata m = empty_metadata(index, save_id);
  m.tensors = index.tensors;
  m.objects = index.objects;
  std::vector<int> file_of_rank(static_cast<std::size_t>(index.world_size), -1);
  auto file_of = [&](std::uint32_t rank) {
    int& f = file_of_rank.at(rank);
    if (f < 0) {
      f = static_cast<int>(m.files.size());
      m.files.push_back(file_record{data_file_name(static_cast<int>(rank), save_id),
                                    static_cast<int>(rank), index.bytes_of_rank.at(rank)});
    }
    return static_cast<std::uint32_t>(f);
  };
  for (auto& [key, t] : m.tensors)
    for (auto& c : t.chunks) c.where.file = file_of(c.where.file);
  for (int r = 0; r < index.world_size; ++r)  // objects in rank order, as planned
    for (const auto& slot : index.slots[static_cast<std::size_t>(r)])
      if (slot.is_object)
        m.objects.at(slot.key).where.file = file_of(static_cast<std::uint32_t>(r));
  for (std::size_t r = 0; r < reports.size(); ++r) {
    result<detail::native_write_report> got =
        detail::decode_message<detail::native_write_report>(reports[r]);
    if (!got) throw exception(std::move(got).err().with_rank(static_cast<int>(r)));
    detail::native_write_report& rep = *got;
    if (rep.items.size() != index.slots[r].size())
      throw exception(make_error(errc::comm, "malformed write report between ranks: " +
                                                 std::to_string(rep.items.size()) + " items for " +
                                                 std::to_string(index.slots[r].size()) + " planned")
                          .with_rank(static_cast<int>(r)));
    for (std::size_t i = 0; i < rep.items.size(); ++i) {
      const write_slot& s = index.slots[r][i];
      extent& e =
          s.is_object ? m.objects.at(s.key).where : m.tensors.at(s.key).chunks.at(s.chunk).where;
      e.checksums = std::move(rep.items[i].checksums);
      if (auto& c = rep.items[i].compressed) {
        e.byte_offset = c->file_offset;
        e.block_offsets = std::move(c->block_offsets);
        e.block_stored = std::move(c->block_stored);
      }
    }
    if (rep.compressed && file_of_rank[r] >= 0)
      m.files[static_cast<std::size_t>(file_of_rank[r])].nbytes = rep.file_size;
  }
  m.version = required_version(m);
  return m;
}

CAIRN_INLINE void native_strategy::abandon(const planned_save& plan,
                                           const written_save& w,
                                           storage_ref st) const {
  if (plan.index.writes(plan.rank)) (void)st.remove(data_file_name(plan.rank, plan.save_id));
  // Rank 0's common state and this rank's index file, also when a put failed after all (a
  // lost acknowledgement).
  if (plan.rank == 0 && !plan.commons.empty()) (void)st.remove(common_file_name(plan.save_id));
  const auto* state = std::any_cast<written_state>(&w.local);
  if (!state || state->index_written || w.failure)
    (void)st.remove(index_file_name(plan.rank, plan.save_id));
}

CAIRN_INLINE result<bool> native_strategy::committed(const planned_save& plan,
                                                     const written_save&,
                                                     storage_ref st) const {
  CAIRN_TRY_ASSIGN(bool present, st.exists(metadata_name));
  if (!present) return false;
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_manifest(st));
  return m.save_id == plan.save_id;
}

}  // namespace cairn
