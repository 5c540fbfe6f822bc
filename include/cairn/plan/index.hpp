// cairn/plan/index.hpp: the format-neutral index of a checkpoint: tensors with the chunks that
// tile them, sharded objects, and where each one's bytes live (a file index and byte range, with
// a checksum per block). Save planning produces it (files are then writing ranks); every format
// reader describes what it reads in its terms; load planning consumes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/plan/box.hpp"

namespace cairn {

/// Default checksum block size (bytes).
inline constexpr std::uint64_t default_block_size = std::uint64_t{1} << 20;
/// Largest checksum block size a save accepts and a reader trusts (64 MiB): readers size their
/// buffers by it, so a file claiming more is rejected as corrupt.
inline constexpr std::uint64_t max_block_size = std::uint64_t{64} << 20;

/// Where a run of bytes lives: file index, byte range, and one checksum per block. In a save
/// plan (`save_index`), `file` is the rank that writes the bytes and `byte_offset` their place in
/// what that rank writes; a format maps ranks to its own files.
struct extent {
  std::uint32_t file = 0;  ///< index into the checkpoint's files (a save plan: the writing rank)
  std::uint64_t byte_offset = 0;
  std::uint64_t nbytes = 0;              ///< bytes of the data (before compression)
  std::vector<std::uint64_t> checksums;  ///< XXH3-64 of each block_size block of the data
  /// Compressed extents (format version 3): each block is stored on its own, `block_offsets[b]`
  /// (absolute, in the file) and `block_stored[b]` bytes long. A block whose stored length
  /// equals its data length is stored raw; otherwise it is one zstd frame. Checksums are of the
  /// data, verified after decompressing. Empty for an uncompressed extent (stored as it is at
  /// `byte_offset`).
  std::vector<std::uint64_t> block_offsets = {}, block_stored = {};
  /// True when the blocks are stored compressed (`block_offsets` / `block_stored` set).
  bool compressed() const noexcept { return !block_stored.empty(); }
  /// Bytes the extent occupies in its file.
  std::uint64_t stored_bytes() const noexcept;
};

/// One saved box of a tensor. Untiled (`tiles` empty), it is stored row-major with one
/// checksum per `block_size` bytes. Tiled, its tiles (see `for_each_tile`) are stored one after
/// the other, each row-major and at most `block_size` bytes, with one checksum per tile.
/// `metadata_from_json` hands readers every tile as a chunk of its own.
struct chunk_record {
  box region;
  extent where;
  tile_counts tiles;  ///< tiles per axis, or empty
};

/// A saved tensor: dtype, global shape, and the chunks that tile it.
struct tensor_record {
  dtype type = dtype::f32;
  shape global_shape;
  std::vector<chunk_record> chunks;
  /// Bytes of the whole tensor.
  std::uint64_t nbytes() const {
    return static_cast<std::uint64_t>(numel(global_shape)) * dtype_size(type);
  }
  /// Bytes the tensor's chunks occupy in files (less than the data when compressed).
  std::uint64_t stored_bytes() const;
  /// Bytes of the tensor's chunks before compression.
  std::uint64_t chunk_bytes() const;
};

/// A saved sharded object, keyed in metadata by its unique key (`key/shard_<off>_<shape>`).
struct object_record {
  std::string key;
  shape global_shape;
  shape global_offset;
  extent where;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/index-inl.hpp"
#endif
