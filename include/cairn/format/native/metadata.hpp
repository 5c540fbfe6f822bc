// cairn/format/native/metadata.hpp: the native format's metadata (what `metadata.json` holds), with
// its JSON encoding (fmt) and decoding (simdjson). Specified in docs/format.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/checksum.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/plan/index.hpp"

namespace cairn {

/// The newest native format version this build writes and reads (5: index files that describe
/// a tensor saved as a regular grid once, with one packed entry per cell; 4: a manifest with one
/// entry per tensor and binary index files with the chunks; 3: zstd-compressed blocks; 2: tiled
/// chunks; 1: none of these). A save writes the lowest version that holds what it wrote; a
/// reader rejects anything newer.
inline constexpr int format_version = 5;
/// Name of the committed metadata object; a checkpoint without it is incomplete.
inline constexpr std::string_view metadata_name = "metadata.json";

/// Data file name of a rank for a save id.
inline std::string data_file_name(int rank, const std::string& save_id) {
  return "data." + std::to_string(rank) + "." + save_id + ".cairn";
}
/// Common-state file name for a save id.
inline std::string common_file_name(const std::string& save_id) {
  return "common." + save_id + ".cairn";
}
/// Index file name (format version 4) of the rank that owns some tensors' index sections.
inline std::string index_file_name(int rank, const std::string& save_id) {
  return "index." + std::to_string(rank) + "." + save_id + ".cairn";
}

/// What a file of a checkpoint holds.
enum class file_role : std::uint8_t {
  data,    ///< chunks and objects a rank wrote
  common,  ///< the common state (rank 0)
  index,   ///< index sections of the tensors a rank owns (format version 4)
};

/// A data, common-state or index file of the checkpoint.
struct file_record {
  std::string name;  ///< object name relative to the checkpoint root
  int rank = 0;      ///< the rank that wrote it
  std::uint64_t nbytes = 0;
  file_role role = file_role::data;
  std::uint64_t checksum = 0;  ///< index files: XXH3-64 of the file (its trailer holds the same)
};

/// Where a tensor's chunks are when the manifest does not list them (format version 4): a
/// section of an index file, checked by its XXH3-64 before it is parsed.
struct index_ref {
  std::uint32_t file = 0;  ///< index into `checkpoint_metadata::files` (an index file)
  std::uint64_t offset = 0, length = 0;
  std::uint64_t checksum = 0;
  std::uint64_t chunks = 0;  ///< chunks the section holds (before tiles are flattened)
};

/// A saved common value: its type and its byte range inside the common-state extent.
struct common_record {
  common_kind kind = common_kind::scalar;
  dtype type = dtype::u8;
  std::uint64_t offset = 0;
  std::uint64_t nbytes = 0;
};

/// Everything `metadata.json` says about a checkpoint.
struct checkpoint_metadata {
  int version = format_version;
  int world_size = 1;   ///< ranks that saved it
  std::string save_id;  ///< unique per save; part of every data file name
  std::uint64_t block_size = default_block_size;
  std::vector<file_record> files;
  std::map<std::string, std::string> content_metadata;  ///< the user's string map
  /// Every tensor: dtype and shape, and its chunks once they are known (see `index_refs`).
  std::map<std::string, tensor_record> tensors;
  /// Format version 4: tensors whose chunks are still in an index file, by key. Readers call
  /// `read_index_sections` for the keys they need; `read_metadata` reads them all.
  std::map<std::string, index_ref> index_refs;
  std::map<std::string, object_record> objects;  ///< by unique key
  std::optional<extent> common;                  ///< the common-state bytes, if any
  std::map<std::string, common_record> commons;  ///< by tree path
  /// The format the checkpoint was read from: "cairn", or a foreign one ("torch_dist",
  /// "safetensors") that `read_any_metadata` described in these terms.
  std::string format = "cairn";
  /// False for a foreign format: extents carry no checksums and reads are not verified
  /// (`block_size` is then only the read granularity).
  bool verified() const noexcept { return format == "cairn"; }
  /// Common values a foreign format holds outside any extent (Megatron's `common.pt`).
  std::map<std::string, common_value> inline_commons;
};

/// The lowest format version that holds `m`: 5 with index files (this build writes version 5
/// index files), 3 when an extent is
/// compressed, 2 when a chunk is tiled, else 1. Writers set `version` from it, so older readers
/// read what they can.
CAIRN_INLINE int required_version(const checkpoint_metadata& m);

namespace detail {

CAIRN_INLINE const char* common_kind_name(common_kind k);

}  // namespace detail

/// The last member of `metadata.json`: `"metadata_checksum":"<16 hex digits>"`, the XXH3-64 of
/// every byte of the document before it. Written since format version 3; a document without it
/// (written by an older cairn) is read unchecked.
inline constexpr std::string_view metadata_checksum_member = "\"metadata_checksum\":";

/// Encodes metadata as JSON (one tensor per line, so large checkpoints stay diffable), with its
/// own checksum last (see `metadata_checksum_member`).
CAIRN_INLINE std::string to_json(const checkpoint_metadata& m);

/// `json` (a `metadata.json` document, perhaps edited by hand) with its `metadata_checksum`
/// recomputed, so that it loads again. The load-side checks do not rely on the checksum alone:
/// whoever can rewrite the file can rewrite its checksum.
CAIRN_INLINE std::string reseal_metadata_json(std::string_view json);

/// Decodes `metadata.json`. `where` names the file in errors. Rejects a newer format version
/// with errc::unsupported_version and malformed content with errc::corrupt.
CAIRN_INLINE result<checkpoint_metadata> metadata_from_json(std::string_view json,
                                                            const std::string& where,
                                                            bool allow_unverified = false);

namespace detail {

/// Whether extent `e` lies inside its file (each stored block, when compressed).
CAIRN_INLINE bool extent_inside_file(const checkpoint_metadata& m, const extent& e);

/// Every chunk of tensor `k` lies inside its file and holds exactly the bytes its box does: a
/// reader copies chunks into user memory on these numbers. `where` names the file in errors.
CAIRN_INLINE result<void> check_tensor_chunks(const checkpoint_metadata& m,
                                              const std::string& k,
                                              const tensor_record& t,
                                              const std::string& where);

/// Replaces tensor `k`'s tiled chunks by their tiles, each a chunk of its own with its one
/// checksum (what readers see). `where` names the file in errors.
CAIRN_INLINE result<void> flatten_tensor_tiles(const checkpoint_metadata& m,
                                               const std::string& k,
                                               tensor_record& t,
                                               const std::string& where);

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/metadata-inl.hpp"
#endif
