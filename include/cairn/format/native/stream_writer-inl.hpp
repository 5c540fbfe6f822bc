// cairn/format/native/stream_writer-inl.hpp: the bodies of cairn/format/native/stream_writer.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <utility>
#include <vector>

#include "cairn/core/checksum.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/stream_writer.hpp"
#include "cairn/format/native/writer.hpp"

namespace cairn::native {

CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         const stream::stream_settings& settings,
                                         const std::map<std::string, stream::object_entry>& objects,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress) {
  const std::uint64_t B = default_block_size;
  checkpoint_metadata m;
  m.world_size = 1;
  m.block_size = B;
  // The save id: a hash of the keys and sizes, so that converting the same input twice names
  // the data file the same.
  cairn::detail::message_writer idw;
  for (const auto& t : src.tensors())
    cairn::detail::write_message(
        idw, std::pair(t.key, static_cast<std::uint64_t>(numel(t.global_shape))));
  m.save_id = checksum_hex(checksum(idw.data())).substr(0, 12);
  const std::string data_name = data_file_name(0, m.save_id);
  std::vector<const stream::tensor_entry*> ts;
  for (const auto& t : src.tensors()) {
    ts.push_back(&t);
    m.tensors[t.key] =
        tensor_record{stream::output_dtype(t.type, settings.to_dtype), t.global_shape, {}};
  }
  CAIRN_TRY_ASSIGN(auto out, dst.open_writer(data_name));
  std::uint64_t off = 0;
  CAIRN_TRY(stream::detail::pump(
      src, stream::detail::plan_jobs(ts, settings), settings, stats, progress,
      [&](const stream::detail::slab_job& job, std::span<const std::byte> bytes) -> result<void> {
        auto w = out->write_at(off, bytes);
        if (!w) return std::move(w).err().with_key(job.t->key);
        m.tensors[job.t->key].chunks.push_back(
            chunk_record{job.region, extent{0, off, bytes.size(), block_checksums(bytes, B)}, {}});
        off += bytes.size();
        return ok();
      }));
  for (const auto& [u, o] : objects) {
    auto w = out->write_at(off, o.bytes);
    if (!w) return std::move(w).err().with_key(u);
    m.objects.emplace(u,
                      object_record{o.key, o.global_shape, o.global_offset,
                                    extent{0, off, o.bytes.size(), block_checksums(o.bytes, B)}});
    off += o.bytes.size();
  }
  stats.objects = objects.size();
  if (auto f = out->finish(); !f) return std::move(f).err().with_file(dst.describe(data_name));
  m.files.push_back(file_record{data_name, 0, off});
  stats.files.push_back(data_name);
  stats.tensors = ts.size();
  CAIRN_TRY_ASSIGN(auto commons, src.commons());
  if (!commons.empty()) {
    CAIRN_TRY_ASSIGN(common_state cs,
                     write_common_state(dst, common_file_name(m.save_id), commons, B));
    stats.files.push_back(cs.name);
    add_common_state(m, std::move(cs));
  }
  m.content_metadata = src.content_metadata();
  m.version = required_version(m);  // 1: nothing tiled or compressed
  CAIRN_TRY(put_metadata(dst, m));
  stats.files.emplace_back(metadata_name);
  return ok();
}

CAIRN_INLINE result<void> detail::stream_write(stream::source& src,
                                               storage_ref dst,
                                               const stream::write_job& job,
                                               stream::stream_stats& stats,
                                               cairn::detail::progress_meter* progress) {
  return write_streamed(src, dst, job.settings, job.objects, stats, progress);
}

}  // namespace cairn::native
