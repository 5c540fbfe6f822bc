// cairn/convert/source.hpp: `open_source`, whatever readable checkpoint is on a storage as a
// `stream::source` (format/stream/source.hpp) that `unshard` and `convert` stream from, and the
// names the source types had in `cairn::convert`. Notes in docs/unshard.md.
#pragma once

#include <memory>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/source.hpp"
#include "cairn/format/foreign.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::convert {

using stream::box_read;
using stream::object_entry;
using stream::source;
using stream::tensor_entry;
/// A native or safetensors checkpoint read through cairn's box reader.
using native_source = stream::catalog_source;
/// A PyTorch DCP checkpoint read through `dcp::reader`.
using dcp_source = dcp::source;

/// Opens whatever readable format is on `st`: a cairn checkpoint (`metadata.json` saying
/// `"format":"cairn"`), a DCP checkpoint (`.metadata`, with or without Megatron's
/// `metadata.json`), or safetensors (an index, or `model.safetensors`). Fails with
/// errc::incomplete_checkpoint when none is there.
CAIRN_INLINE result<std::unique_ptr<source>> open_source(storage_ref st);

}  // namespace cairn::convert

#if CAIRN_HEADER_ONLY
#  include "cairn/convert/source-inl.hpp"
#endif
