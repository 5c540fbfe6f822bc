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
                                  opt.zstd_level, &file_size, &progress));
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
  detail::binary_writer sums;
  sums.blob(index.partial ? encode_part(index, rank) : bytes{});
  sums.u8(opt.zstd_level > 0);
  sums.u64(file_size);
  for (const auto& it : plan.items) {
    sums.u64s(it.checksums);
    if (opt.zstd_level > 0) {
      sums.u64(it.file_offset);
      sums.u64s(it.block_offsets);
      sums.u64s(it.block_stored);
    }
  }
  out.report = std::move(sums.data());
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
  std::vector<detail::binary_writer> to(static_cast<std::size_t>(world));
  for (const auto& [key, t] : mine) {
    bytes section;
    append_index_section(section, key, t);
    to[static_cast<std::size_t>(owner_of(key, world))].blob(section);
  }
  std::vector<bytes> out;
  for (auto& w : to) out.push_back(std::move(w.data()));
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
    detail::binary_reader rd(routed[r]);
    while (!rd.done()) {
      bytes section = rd.blob();
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
  detail::binary_writer rep;
  rep.u8(plan.index.writes(rank));
  rep.u64(opt.zstd_level > 0 ? state.file_size : plan.index.bytes_of_rank.at(rank));
  // This rank's objects, with their checksums.
  const auto& slots = plan.index.slots.at(static_cast<std::size_t>(rank));
  std::uint64_t nobjects = 0;
  for (const auto& s : slots) nobjects += s.is_object;
  rep.u64(nobjects);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].is_object) continue;
    const object_record& o = plan.index.objects.at(slots[i].key);
    rep.str(slots[i].key);
    rep.str(o.key);
    rep.ints(o.global_shape);
    rep.ints(o.global_offset);
    put_extent(rep, written_extent(o.where, plan.items.at(i)));
  }
  rep.u8(!owned.empty());
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
    rep.u64(built.file.size());
    rep.u64(built.checksum);
    rep.u64(built.directories.size());
    for (const auto& d : built.directories) {
      const tensor_record& t = owned.at(d.key);
      rep.str(d.key);
      rep.u8(static_cast<std::uint8_t>(t.type));
      rep.ints(t.global_shape);
      rep.u64(d.offset);
      rep.u64(d.length);
      rep.u64(d.checksum);
      rep.u64(t.chunks.size());
    }
  }
  out.report = std::move(rep.data());
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
    detail::binary_reader rd(reports[r]);
    merge_part(rd.blob(), static_cast<int>(r), whole);
  }
  return metadata_of_whole(whole, save_id, reports);
}

CAIRN_INLINE checkpoint_metadata native_strategy::manifest_of(const save_index& index,
                                                              const std::string& save_id,
                                                              const std::vector<bytes>& reports) {
  checkpoint_metadata m = empty_metadata(index, save_id);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    detail::binary_reader rd(reports[r]);
    const int rank = static_cast<int>(r);
    const bool writes = rd.u8();
    const std::uint64_t size = rd.u64();
    const auto data_file = static_cast<std::uint32_t>(m.files.size());
    if (writes) m.files.push_back(file_record{data_file_name(rank, save_id), rank, size});
    for (std::uint64_t n = rd.u64(); n > 0; --n) {
      std::string unique = rd.str();
      object_record o;
      o.key = rd.str();
      o.global_shape = rd.ints();
      o.global_offset = rd.ints();
      o.where = get_extent(rd);
      o.where.file = data_file;
      m.objects.emplace(std::move(unique), std::move(o));
    }
    if (!rd.u8()) continue;  // owns no tensor
    const auto index_file = static_cast<std::uint32_t>(m.files.size());
    file_record f{index_file_name(rank, save_id), rank, rd.u64(), file_role::index};
    f.checksum = rd.u64();
    m.files.push_back(std::move(f));
    for (std::uint64_t n = rd.u64(); n > 0; --n) {
      std::string key = rd.str();
      tensor_record t;
      t.type = static_cast<dtype>(rd.u8());
      t.global_shape = rd.ints();
      index_ref ref;
      ref.file = index_file;
      ref.offset = rd.u64();
      ref.length = rd.u64();
      ref.checksum = rd.u64();
      ref.chunks = rd.u64();
      m.tensors.emplace(key, std::move(t));
      m.index_refs.emplace(std::move(key), ref);
    }
  }
  m.version = required_version(m);
  return m;
}

CAIRN_INLINE bytes native_strategy::encode_part(const save_index& index, int rank) {
  detail::binary_writer w;
  const auto& slots = index.slots.at(static_cast<std::size_t>(rank));
  w.u64(index.bytes_of_rank.at(static_cast<std::size_t>(rank)));
  w.u64(slots.size());
  for (const write_slot& s : slots) {
    w.u8(s.is_object);
    w.str(s.key);
    if (s.is_object) {
      const object_record& o = index.objects.at(s.key);
      w.str(o.key);
      w.ints(o.global_shape);
      w.ints(o.global_offset);
      w.u64(o.where.byte_offset);
      w.u64(o.where.nbytes);
      continue;
    }
    const tensor_record& t = index.tensors.at(s.key);
    const chunk_record& c = t.chunks.at(s.chunk);
    w.u8(static_cast<std::uint8_t>(t.type));
    w.ints(t.global_shape);
    w.ints(c.region.offset);
    w.ints(c.region.size);
    w.ints(c.tiles);
    w.u64(c.where.byte_offset);
    w.u64(c.where.nbytes);
  }
  return std::move(w.data());
}

CAIRN_INLINE void native_strategy::merge_part(std::span<const std::byte> part,
                                              int rank,
                                              save_index& whole) {
  if (part.empty()) return;
  detail::binary_reader rd(part);
  auto r = static_cast<std::size_t>(rank);
  whole.bytes_of_rank.at(r) = rd.u64();
  auto file = static_cast<std::uint32_t>(rank);
  for (std::uint64_t n = rd.u64(); n > 0; --n) {
    write_slot s;
    s.is_object = rd.u8();
    s.key = rd.str();
    if (s.is_object) {
      object_record o;
      o.key = rd.str();
      o.global_shape = rd.ints();
      o.global_offset = rd.ints();
      o.where.file = file;
      o.where.byte_offset = rd.u64();
      o.where.nbytes = rd.u64();
      whole.objects[s.key] = std::move(o);
    } else {
      tensor_record& t = whole.tensors[s.key];
      t.type = static_cast<dtype>(rd.u8());
      t.global_shape = rd.ints();
      chunk_record c;
      c.region.offset = rd.ints();
      c.region.size = rd.ints();
      c.tiles = rd.ints();
      c.where.file = file;
      c.where.byte_offset = rd.u64();
      c.where.nbytes = rd.u64();
      t.chunks.push_back(std::move(c));
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

CAIRN_INLINE void native_strategy::put_extent(detail::binary_writer& w, const extent& e) {
  w.u64(e.byte_offset);
  w.u64(e.nbytes);
  w.u64s(e.checksums);
  w.u64s(e.block_offsets);
  w.u64s(e.block_stored);
}

CAIRN_INLINE extent native_strategy::get_extent(detail::binary_reader& rd) {
  extent e;
  e.byte_offset = rd.u64();
  e.nbytes = rd.u64();
  e.checksums = rd.u64s();
  e.block_offsets = rd.u64s();
  e.block_stored = rd.u64s();
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
    detail::binary_reader rd(reports[r]);
    (void)rd.blob();  // the rank's part of a partial index (merged by metadata_of)
    bool compressed = rd.u8();
    std::uint64_t file_size = rd.u64();
    for (const auto& s : index.slots[r]) {
      extent& e =
          s.is_object ? m.objects.at(s.key).where : m.tensors.at(s.key).chunks.at(s.chunk).where;
      e.checksums = rd.u64s();
      if (compressed) {
        e.byte_offset = rd.u64();
        e.block_offsets = rd.u64s();
        e.block_stored = rd.u64s();
      }
    }
    if (compressed && file_of_rank[r] >= 0)
      m.files[static_cast<std::size_t>(file_of_rank[r])].nbytes = file_size;
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
