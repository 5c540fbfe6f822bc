// cairn/format/dcp/stream_writer.hpp: a PyTorch DCP checkpoint in Megatron's torch_dist layout
// written streaming from any `stream::source`: what `convert --format torch_dist` writes.
#pragma once

#include <map>
#include <string>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/source.hpp"
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

}  // namespace cairn::dcp

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/stream_writer-inl.hpp"
#endif
