// cairn/format/native/stream_writer.hpp: a native cairn checkpoint written streaming from any
// `stream::source`: what `convert --format native` writes (registered as the stream writer
// "native", alias "cairn").
#pragma once

#include <map>
#include <string>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/format/stream/writers.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::native {

/// Writes `src` to `dst` as a native checkpoint saved by one rank: every slab becomes a chunk
/// of one data file, checksummed per block as it streams past, then `objects` (the source's
/// sharded objects); common values go to the common-state file; `metadata.json` is written
/// last. The save id is derived from the tensor list, so the same source gives byte-identical
/// output.
CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         const stream::stream_settings& settings,
                                         const std::map<std::string, stream::object_entry>& objects,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress = nullptr);

namespace detail {
/// `write_streamed` as the registered stream writer "native" (alias "cairn").
CAIRN_INLINE result<void> stream_write(stream::source& src,
                                       storage_ref dst,
                                       const stream::write_job& job,
                                       stream::stream_stats& stats,
                                       cairn::detail::progress_meter* progress);

inline const bool stream_writer_registered =
    stream::register_stream_writer({.name = "native",
                                    .aliases = {"cairn"},
                                    .format = "cairn",
                                    .holds_objects = true,
                                    .holds_commons = true,
                                    .write = &stream_write})
        .value();
}  // namespace detail

}  // namespace cairn::native

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/stream_writer-inl.hpp"
#endif
