// cairn/format/dcp/metadata.hpp: PyTorch Distributed Checkpoint's `.metadata` pickle — build it
// from plain structs (torch 2.x or torch 1.13 module paths) and parse it from any torch version,
// tolerating unknown classes and extra fields (StorageMeta, transform_descriptors, Megatron's
// MCoreMetadata subclass). Layout notes in docs/torch-formats.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::dcp {

/// Name of the metadata object in a DCP checkpoint directory.
inline constexpr std::string_view metadata_name = ".metadata";

/// One saved chunk of a tensor: `ChunkStorageMetadata(offsets, sizes)`.
struct chunk {
  shape offsets;
  shape sizes;
  friend bool operator==(const chunk&, const chunk&) = default;
};

/// `TensorStorageMetadata`: dtype (from TensorProperties), global size and chunks.
struct tensor_meta {
  dtype type = dtype::f32;
  shape size;
  std::vector<chunk> chunks;
  bool requires_grad = false;
};

/// `BytesStorageMetadata`: a non-tensor item saved with `torch.save`.
struct bytes_meta {};

/// `MetadataIndex(fqn, offset, index)`: the key of `storage_data`. `offset` is the chunk's
/// offsets for tensors and absent for bytes items.
struct index {
  std::string fqn;
  std::optional<shape> offset;
  std::optional<std::int64_t> hint;  ///< `index`, only a lookup hint
};

/// `_StorageInfo`: the byte range of an item's `torch.save` blob inside a `.distcp` file.
struct storage_info {
  std::string relative_path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// A DCP checkpoint's metadata. Maps keep fqn order sorted, so the pickle is deterministic.
struct metadata {
  std::map<std::string, std::variant<tensor_meta, bytes_meta>> state_dict_metadata;
  /// `planner_data`: fqn -> flattening path (strings, or ints for list indices). Written as a
  /// dict, never None (`_EmptyStateDictLoadPlanner` tests `k in planner_data`).
  std::map<std::string, std::vector<pickle::value>> planner_data;
  std::vector<std::pair<index, storage_info>> storage_data;
  std::optional<std::string> version;  ///< `version` ("1.0.0"); written only when set
  /// What the reader found and did not interpret (e.g. `mcore_data`, `storage_meta`), by
  /// attribute name; ignored by the writer.
  std::map<std::string, pickle::value> extras;
  std::string class_module, class_name;  ///< the Metadata class that was read

  /// The storage_info of item (fqn, offset), or nullptr.
  const storage_info* find(std::string_view fqn, const std::optional<shape>& offset) const;
};

/// Which module paths the writer names.
enum class flavor {
  /// torch >= 2.0: `torch.distributed.checkpoint.{metadata,filesystem}`, TensorProperties from
  /// `torch.distributed._shard.sharded_tensor.metadata` (loads on every 2.x).
  torch2,
  /// torch 1.13's prototype: `torch.distributed._shard.checkpoint.{metadata,filesystem}`.
  torch1_13,
};

/// Checks the save-time invariants of `_validate_global_plan`: every chunk lies inside the
/// tensor, chunks do not overlap, and their volumes sum to the tensor's volume.
CAIRN_INLINE result<void> validate(const metadata& m);

namespace detail {
using pickle::value;
CAIRN_INLINE value ints_tuple(const shape& s);
inline value torch_size(const shape& s) {
  return value::instance("torch", "Size", value::tuple({ints_tuple(s)}), value(), false);
}
CAIRN_INLINE value dataclass(std::string module,
                             std::string name,
                             std::vector<std::pair<std::string, value>> fields);
}  // namespace detail

/// The `.metadata` object tree for `m` with `f`'s module paths: dataclasses as NEWOBJ + BUILD
/// of their field dict, TensorProperties with its 5-tuple state, `torch.Size` and `torch.<dtype>`
/// globals, `torch.serialization._get_layout('torch.strided')`. Only classes that exist in the
/// target torch are named (`storage_meta` is written as None).
CAIRN_INLINE pickle::value to_value(const metadata& m, flavor f = flavor::torch2);

/// `.metadata` bytes for `m` (pickle protocol 4, like `pickle.dump`). Validates `m` first.
CAIRN_INLINE result<std::string> encode(const metadata& m, flavor f = flavor::torch2);

namespace detail {
/// A `torch.Size((ints...))` or a plain tuple/list of ints as a shape (extents unchecked).
CAIRN_INLINE std::optional<shape> as_shape(const value& v);
CAIRN_INLINE std::string shape_str(const shape& s);
CAIRN_INLINE bool ends_with(std::string_view s, std::string_view suffix);
}  // namespace detail

namespace detail {

/// An errc::corrupt error "dcp metadata: <msg>" naming `file` and `key`.
inline error bad_metadata(const std::string& msg,
                          std::string_view file,
                          std::string_view key = {}) {
  return format_detail::corrupt("dcp metadata: " + msg, file, key);
}

/// Sets `t.type` and `t.requires_grad` from TensorProperties `props` of tensor `fqn`: a 5-tuple
/// state (dtype, layout, requires_grad, mem format, pin_memory) or, in other versions, a dict
/// with "dtype".
CAIRN_INLINE result<void> parse_tensor_properties(const value& props,
                                                  const std::string& fqn,
                                                  std::string_view file,
                                                  tensor_meta& t);

/// Sets `t.size` from `size` (a torch.Size) of tensor `fqn`, whose `t.type` is set: no negative
/// extent and at most 2^62 bytes.
CAIRN_INLINE result<void> parse_tensor_size(const value& size,
                                            const std::string& fqn,
                                            std::string_view file,
                                            tensor_meta& t);

/// One ChunkStorageMetadata `c` of tensor `fqn` of size `size`: offsets and sizes of the
/// tensor's rank, lying inside it.
CAIRN_INLINE result<chunk> parse_chunk(const value& c,
                                       const shape& size,
                                       const std::string& fqn,
                                       std::string_view file);

/// A TensorStorageMetadata entry `v` of `fqn`: its properties (dtype), size and chunks.
CAIRN_INLINE result<tensor_meta> parse_tensor_meta(const value& v,
                                                   const std::string& fqn,
                                                   std::string_view file);

/// Fills `m.state_dict_metadata` from the `state_dict_metadata` dict `sdm`: fqn -> tensor or
/// bytes entry.
CAIRN_INLINE result<void> parse_state_dict_metadata(const value& sdm,
                                                    std::string_view file,
                                                    metadata& m);

/// One `storage_data` entry: MetadataIndex `k` (fqn, offset, index) and _StorageInfo `v`
/// (relative_path, and offset and length in [0, 2^63)).
CAIRN_INLINE result<std::pair<index, storage_info>> parse_storage_item(const value& k,
                                                                       const value& v,
                                                                       std::string_view file);

/// Keeps the Metadata fields of `o` that cairn does not interpret in `m.extras`.
CAIRN_INLINE void collect_extras(const pickle::object& o, metadata& m);

}  // namespace detail

/// Interprets an unpickled `.metadata` tree. Classes are recognized by name whatever their module
/// (torch 1.13 `_shard` paths, 2.x paths, subclasses like Megatron's `MCoreMetadata`); fields
/// cairn does not use are kept in `extras`. `file` names the source in errors.
CAIRN_INLINE result<metadata> from_value(const pickle::value& root, std::string_view file = {});

/// Parses `.metadata` bytes.
CAIRN_INLINE result<metadata> decode(std::span<const std::byte> bytes, std::string_view file = {});

/// Checks that the data `m` claims is there, before anything is sized by it: every item's
/// byte range lies inside its file on `st` (one `size` per file), items of one file do not
/// overlap, every tensor chunk has an item at least as large as the chunk's bytes, and a
/// tensor's chunks hold at least as many elements as the tensor. So the bytes of all tensors
/// are at most the bytes of the files. `errc::corrupt` naming the key, file and offset.
CAIRN_INLINE result<void> check_storage(storage_ref st, const metadata& m);

/// Reads and parses the `.metadata` object of a checkpoint on `st` (`name` defaults to it).
CAIRN_INLINE result<metadata> read(storage_ref st, std::string_view name = metadata_name);

/// Writes `.metadata` with `put` (atomic: readers never see a partial file).
CAIRN_INLINE result<void> write(storage_ref st,
                                const metadata& m,
                                flavor f = flavor::torch2,
                                std::string_view name = metadata_name);

}  // namespace cairn::dcp

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/metadata-inl.hpp"
#endif
