// cairn/format/safetensors/reader.hpp: a safetensors checkpoint (one file, or a Hugging Face
// index and its files) described as `checkpoint_metadata`, so that `load` reads it as it reads
// its own format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Safetensors checkpoints described as checkpoint metadata: a Hugging Face index
/// (`model.safetensors.index.json`) and the files it names, or one `model.safetensors`, or
/// PyTorch DCP's sharded safetensors (`HuggingFaceStorageWriter(save_distributed=True)`: one
/// file per rank and output file, no index, each piece's place in its tensor in the
/// `DCP_SHARDING_INFO` entry of `__metadata__`; a tensor's shape is the extent of its pieces).
/// A whole tensor is one chunk; the headers' other `__metadata__` entries become the content
/// metadata.
CAIRN_INLINE result<checkpoint_metadata> safetensors_as_metadata(storage_ref st);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/safetensors/reader-inl.hpp"
#endif
