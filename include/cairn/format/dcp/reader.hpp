// cairn/format/dcp/reader.hpp: the one reader of PyTorch DCP (torch_dist) checkpoints.
// `dcp::reader` parses and checks `.metadata`, finds each chunk's item and reads boxes of
// tensors from the items; `load` reads a DCP checkpoint through `dcp_as_metadata` (the reader's
// items described as `checkpoint_metadata`, so each rank plans against the same chunk list and
// reads only the byte ranges its shards need) and `convert` through `convert::dcp_source`, a
// thin adapter over the reader.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

namespace detail {

/// Splits a sharded object's unique key `key/shard_<offset>_<grid>` (Megatron's spelling, which
/// cairn shares) into key, offset and grid.
CAIRN_INLINE std::optional<std::tuple<std::string, shape, shape>> parse_object_unique_key(
    const std::string& u);

/// A Python value from Megatron's `common.pt` as a common value: int as I64, float as F64,
/// bool as BOOL, str as a string, a list or tuple of one of those as a vector. nullopt for
/// anything else (nested dicts, None, tensors).
CAIRN_INLINE std::optional<common_value> common_from_pickle(const pickle::value& v);

CAIRN_INLINE result<std::uint32_t> file_index_of(storage_ref st,
                                                 checkpoint_metadata& m,
                                                 std::map<std::string, std::uint32_t>& index,
                                                 const std::string& name);

}  // namespace detail

}  // namespace cairn

namespace cairn::dcp {

/// Where the elements of a contiguous tensor item lie in its file.
struct item_span {
  std::string file;          ///< the data file (`relative_path`)
  std::uint64_t offset = 0;  ///< byte offset of the first element in the file
  std::uint64_t nbytes = 0;  ///< bytes of the elements
};

/// The one reader of a DCP checkpoint. `open` reads `.metadata` and checks that the files hold
/// the data it claims (`check_storage`); then each chunk's item is found by key and offsets,
/// items' `torch.save` directories are parsed on first use (a bounded cache), and `read_box`
/// reads any box of a tensor from the items it overlaps, each item only over the byte span the
/// box needs (strided items are read whole). The storage must outlive the reader.
class reader {
 public:
  /// Reads and checks `.metadata` on `st`.
  static result<reader> open(storage_ref st);

  /// The parsed `.metadata`.
  const metadata& meta() const noexcept { return m_; }
  /// The storage read from.
  storage_ref storage() const noexcept { return st_; }

  /// Where chunk `c` of tensor `key` is stored; errc::corrupt when `.metadata` lists the chunk
  /// but no item for it.
  result<const storage_info*> chunk_item(const std::string& key, const chunk& c) const;
  /// Where bytes item `key` is stored, or nullptr.
  const storage_info* bytes_item(const std::string& key) const;

  /// The `torch.save` archive of an item (parsed once; the cache holds at most 4096).
  result<const torch_zip::archive*> item(const storage_info& where);

  /// The tensor an item holds, checked to be a `type` tensor of `volume` elements.
  result<torch_zip::tensor_ref> item_tensor(const storage_info& where,
                                            const std::string& key,
                                            dtype type,
                                            std::int64_t volume);

  /// Where the elements of the `type` tensor of `volume` elements in item `where` lie in its
  /// file. errc::unsupported_version for a strided (non-contiguous) item, which `read_box`
  /// reads but a byte range cannot describe.
  result<item_span> contiguous_span(const storage_info& where,
                                    const std::string& key,
                                    dtype type,
                                    std::int64_t volume);

  /// Reads box `region` (global coordinates) of tensor `key` into `out`, row-major; `out`
  /// holds exactly the box's bytes. Fails when the box lies outside the tensor, or the chunks
  /// do not cover it.
  result<void> read_box(const std::string& key, const box& region, std::span<std::byte> out);

 private:
  reader(storage_ref st, metadata m) : st_(st), m_(std::move(m)) {}

  /// Where the elements of the contiguous tensor `ref` (item `where`, `volume` elements) lie.
  result<item_span> span_of(const storage_info& where,
                            const std::string& key,
                            const torch_zip::tensor_ref& ref,
                            dtype type,
                            std::int64_t volume);

  static bool contiguous(const torch_zip::tensor_ref& ref);

  result<const torch_zip::record*> storage_record(const storage_info& where,
                                                  const std::string& key,
                                                  const torch_zip::tensor_ref& ref);

  /// Reads `part` (inside chunk `c` and inside `region`) into its place in `out`.
  result<void> read_chunk_part(const std::string& key,
                               const tensor_meta& tm,
                               const chunk& c,
                               const box& region,
                               const box& part,
                               std::span<std::byte> out);

  storage_ref st_;
  metadata m_;
  /// (fqn, chunk offsets) -> index into `m_.storage_data` (a list in `.metadata`).
  std::map<std::pair<std::string, shape>, std::size_t> chunk_items_;
  /// fqn of a bytes item -> index into `m_.storage_data`.
  std::map<std::string, std::size_t> bytes_items_;
  std::map<std::pair<std::string, std::uint64_t>, torch_zip::archive> archives_;
};

}  // namespace cairn::dcp

namespace cairn {

/// A PyTorch Distributed Checkpoint (`.metadata` and `.distcp` files; Megatron's torch_dist
/// backend included) described as checkpoint metadata, through `dcp::reader`: every tensor item
/// becomes a chunk at the byte offset of its `torch.save` storage record; bytes items named
/// like sharded objects (`key/shard_<offset>_<grid>`) that hold a uint8 tensor (what cairn's
/// torch_dist strategy writes) become objects; Megatron's `common.pt` values become common
/// values, and its `content_metadata` dict the checkpoint's `content_metadata`. Reads each item's
/// ZIP directory (a few small reads per item). Items stored with a storage offset are supported;
/// non-contiguous ones fail naming the key (convert those with `cairn convert`, which reads them).
CAIRN_INLINE result<checkpoint_metadata> dcp_as_metadata(storage_ref st);

/// The content metadata of a DCP checkpoint: the `content_metadata` dict of Megatron's
/// `common.pt` (empty without one), read without opening `.metadata` or a `.distcp` file.
CAIRN_INLINE result<std::map<std::string, std::string>> dcp_content_metadata(storage_ref st);

namespace detail {
/// Megatron's `content_metadata` dict as a string map: strings as they are, other scalars as
/// Python prints them (`True`, `False`, `None`, `12`, `0.5`); containers are left out.
CAIRN_INLINE std::map<std::string, std::string> content_metadata_from_pickle(
    const pickle::value& dict);

/// Megatron's `common.pt`, when there is one: its values into `m.inline_commons`, its
/// `content_metadata` dict into `m.content_metadata`.
CAIRN_INLINE result<void> read_megatron_common(storage_ref st, checkpoint_metadata& m);

/// The part of `dcp_as_metadata` that is not tensors: the sharded objects (into `m.objects`) and
/// `common.pt`'s values (into `m.inline_commons`), files added to `m.files` through `files`.
CAIRN_INLINE result<void> add_dcp_objects_and_commons(storage_ref st,
                                                      dcp::reader& rd,
                                                      checkpoint_metadata& m,
                                                      std::map<std::string, std::uint32_t>& files);
}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/reader-inl.hpp"
#endif
