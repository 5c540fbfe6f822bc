// cairn/format/dcp/stream_writer.hpp: a PyTorch DCP checkpoint in Megatron's torch_dist layout
// written streaming from any `stream::source`: what `convert --format torch_dist` writes
// (registered as the stream writer "torch_dist", aliases "dcp" and "torch"; its setting "flavor"
// is torch2 or torch1_13).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/format/stream/writers.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::dcp {

/// Writes `src` to `dst` as one data file `__0_0.distcp` of `torch.save` items, one per slab
/// (`settings.slab_bytes`), then `objects` (the source's sharded objects) as u8 items, then the
/// commit files (`.metadata` naming `fl`'s torch module paths, Megatron's `metadata.json` and
/// `common.pt` with the source's common values). Refuses a dtype `fl` cannot hold before it
/// writes anything.
CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         flavor fl,
                                         const stream::stream_settings& settings,
                                         const std::map<std::string, stream::object_entry>& objects,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress = nullptr);

/// The flavor's name as the setting "flavor" spells it: "torch2", "torch1_13".
constexpr std::string_view flavor_name(flavor fl) noexcept {
  return fl == flavor::torch1_13 ? "torch1_13" : "torch2";
}

namespace detail {
/// `write_streamed` as the registered stream writer "torch_dist": its setting "flavor" (default
/// torch2) picks the module paths.
CAIRN_INLINE result<void> stream_write(stream::source& src,
                                       storage_ref dst,
                                       const stream::write_job& job,
                                       stream::stream_stats& stats,
                                       cairn::detail::progress_meter* progress);

inline const bool stream_writer_registered =
    stream::register_stream_writer({.name = "torch_dist",
                                    .aliases = {"dcp", "torch"},
                                    .format = "torch_dist",
                                    .holds_objects = true,
                                    .holds_commons = true,
                                    .settings = {"flavor"},
                                    .write = &stream_write})
        .value();
}  // namespace detail

}  // namespace cairn::dcp

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/stream_writer-inl.hpp"
#endif
