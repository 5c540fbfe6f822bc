// cairn/format/safetensors/stream_writer-inl.hpp: the bodies of
// cairn/format/safetensors/stream_writer.hpp (included by it when header-only; compiled once
// into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>

#include "cairn/detail/parallel.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/stream_writer.hpp"

namespace cairn::safetensors {

CAIRN_INLINE result<std::vector<planned_file>> plan_streamed_files(
    const std::vector<stream::tensor_entry>& ts,
    const write_settings& ws,
    std::optional<dtype> to_dtype) {
  std::vector<tensor_decl> decls;
  for (const auto& t : ts)
    decls.push_back({t.key, stream::output_dtype(t.type, to_dtype), t.global_shape});
  return plan_files(decls, ws.split, ws.chunk_size);
}

CAIRN_INLINE result<void> write_streamed_file(stream::source& src,
                                              storage_ref dst,
                                              const planned_file& f,
                                              const std::map<std::string, std::string>& metadata,
                                              const stream::stream_settings& settings,
                                              stream::stream_stats& stats,
                                              cairn::detail::progress_meter* progress,
                                              stream::slab_buffers* buffers) {
  CAIRN_TRY_ASSIGN(writer w, writer::open(dst, f.name, f.tensors, metadata));
  std::vector<const stream::tensor_entry*> ordered;
  for (const auto& info : w.planned().tensors) {
    const stream::tensor_entry* t = src.find(info.name);
    if (!t) return make_error(errc::not_found, "no such tensor in the source").with_key(info.name);
    ordered.push_back(t);
  }
  CAIRN_TRY(stream::detail::pump(
      src, stream::detail::plan_jobs(ordered, settings), settings, stats, progress,
      [&](const stream::detail::slab_job& job, std::span<const std::byte> bytes) -> result<void> {
        const std::size_t piece = std::size_t{8} << 20;
        std::size_t n = (bytes.size() + piece - 1) / piece;
        return cairn::detail::run_parallel(
            n, settings.io_threads, [&](std::size_t k) -> result<void> {
              std::size_t at = k * piece;
              return w.write_at(job.t->key, job.out_offset + at,
                                bytes.subspan(at, std::min(piece, bytes.size() - at)));
            });
      },
      buffers));
  CAIRN_TRY(w.finish());
  stats.files.push_back(f.name);
  stats.tensors += f.tensors.size();
  return ok();
}

CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         const write_settings& ws,
                                         const stream::stream_settings& settings,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress) {
  CAIRN_TRY_ASSIGN(auto files, plan_streamed_files(src.tensors(), ws, settings.to_dtype));
  stream::slab_buffers buffers;
  std::map<std::string, std::string> metadata = ws.metadata;  // its own keys win
  for (auto& [k, v] : src.content_metadata()) metadata.emplace(k, v);
  for (const auto& f : files)
    CAIRN_TRY(write_streamed_file(src, dst, f, metadata, settings, stats, progress, &buffers));
  if (ws.split != file_split::one_file) {
    CAIRN_TRY_ASSIGN(index ix, index_of(files));
    CAIRN_TRY(write_index(dst, index_name, ix));
    stats.files.emplace_back(index_name);
  }
  return ok();
}

}  // namespace cairn::safetensors
