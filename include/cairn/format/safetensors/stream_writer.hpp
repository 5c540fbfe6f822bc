// cairn/format/safetensors/stream_writer.hpp: safetensors written streaming from any
// `stream::source`, one slab at a time in file order: what `convert` and `unshard` write, and
// how the safetensors save strategy assembles its files from the ranks' shards. Registered as
// the stream writers "one_file" (alias "safetensors"), "per_tensor" and "chunks" (setting
// "chunk_size", in bytes).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/format/stream/writers.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::safetensors {

/// What a streamed safetensors output looks like.
struct write_settings {
  file_split split = file_split::one_file;
  /// `chunks`: the most tensor bytes per file (a tensor larger than this gets a file alone).
  std::uint64_t chunk_size = 5'000'000'000;
  /// The `__metadata__` of every file.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

/// The files that hold `ts` as `ws` says, with the dtypes `to_dtype` converts to.
/// Deterministic for a tensor list.
CAIRN_INLINE result<std::vector<planned_file>> plan_streamed_files(
    const std::vector<stream::tensor_entry>& ts,
    const write_settings& ws,
    std::optional<dtype> to_dtype);

/// Writes the planned file `f`, reading its tensors from `src` one slab at a time in file order
/// (the disk sees one sequential stream; memory bounded by `settings.slab_bytes`), each slab in
/// parallel pieces of 8 MiB. `progress`: told the source bytes done (none when null);
/// `buffers`: slab memory to reuse.
CAIRN_INLINE result<void> write_streamed_file(stream::source& src,
                                              storage_ref dst,
                                              const planned_file& f,
                                              const std::map<std::string, std::string>& metadata,
                                              const stream::stream_settings& settings,
                                              stream::stream_stats& stats,
                                              cairn::detail::progress_meter* progress = nullptr,
                                              stream::slab_buffers* buffers = nullptr);

/// Writes every tensor of `src` to `dst` as `ws` says, then the index (all but `one_file`).
/// Non-tensor items are not written (the caller lists them as skipped).
CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         const write_settings& ws,
                                         const stream::stream_settings& settings,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress = nullptr);

namespace detail {
/// `write_streamed` as the registered stream writer of split `S`; `chunks` reads the setting
/// "chunk_size" (bytes), and every file's `__metadata__` is the job's metadata.
template <file_split S>
result<void> stream_write(stream::source& src,
                          storage_ref dst,
                          const stream::write_job& job,
                          stream::stream_stats& stats,
                          cairn::detail::progress_meter* progress) {
  write_settings ws;
  ws.split = S;
  ws.metadata = job.metadata;
  if (auto it = job.options.find("chunk_size"); it != job.options.end()) {
    CAIRN_TRY_ASSIGN(ws.chunk_size, stream::detail::parse_count(it->first, it->second));
  }
  return write_streamed(src, dst, ws, job.settings, stats, progress);
}

inline const bool stream_writers_registered =
    stream::register_stream_writer({.name = "one_file",
                                    .aliases = {"safetensors"},
                                    .format = "safetensors",
                                    .whole_tensors = true,
                                    .write = &stream_write<file_split::one_file>})
        .value() &&
    stream::register_stream_writer({.name = "per_tensor",
                                    .format = "safetensors",
                                    .whole_tensors = true,
                                    .write = &stream_write<file_split::per_tensor>})
        .value() &&
    stream::register_stream_writer({.name = "chunks",
                                    .format = "safetensors",
                                    .whole_tensors = true,
                                    .settings = {"chunk_size"},
                                    .write = &stream_write<file_split::chunks>})
        .value();
}  // namespace detail

}  // namespace cairn::safetensors

#if CAIRN_HEADER_ONLY
#  include "cairn/format/safetensors/stream_writer-inl.hpp"
#endif
