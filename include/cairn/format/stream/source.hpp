// cairn/format/stream/source.hpp: a readable checkpoint seen as a list of tensors, each read box
// by box into caller memory, plus its sharded objects and common values. What `convert`,
// `unshard` and the safetensors save strategy stream from; `catalog_source` serves every format
// whose reader describes it as cairn metadata (native, safetensors), `dcp::source` serves DCP.
// Notes in docs/unshard.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::stream {

/// A tensor of a source: its key, dtype and global shape.
struct tensor_entry {
  std::string key;
  dtype type = dtype::f32;
  shape global_shape;
  /// Bytes of the whole tensor.
  std::uint64_t nbytes() const noexcept {
    return static_cast<std::uint64_t>(numel(global_shape)) * dtype_size(type);
  }
};

/// A sharded (per-rank) object of a source: its key, grid and position in it, and its bytes.
struct object_entry {
  std::string key;
  shape global_shape;
  shape global_offset;
  std::vector<std::byte> bytes;
  friend bool operator==(const object_entry&, const object_entry&) = default;
};

/// One read: the elements of `region` (global coordinates) of tensor `key`, stored row-major
/// into `out`, which holds exactly `region.volume() * dtype_size` bytes.
struct box_read {
  std::string key;
  box region;
  std::span<std::byte> out;
};

/// A checkpoint that `convert` and `unshard` read from. Implementations read only the bytes a
/// request needs, so memory is bounded by what the caller asks for.
class source {
 public:
  virtual ~source() = default;
  /// The format read ("cairn", "safetensors", "torch_dist"; `detect_format`'s answer).
  virtual std::string_view kind() const noexcept = 0;
  /// Every tensor, sorted by key.
  virtual const std::vector<tensor_entry>& tensors() const noexcept = 0;
  /// Fills every request (one pass over the storage for the whole batch where the format
  /// allows). Errors name the key and file.
  virtual result<void> read(const std::vector<box_read>& reqs) = 0;
  /// Common (non-tensor) values by path, where the format has them in a form cairn decodes
  /// (cairn: the common state; DCP: Megatron's `common.pt`).
  virtual result<std::map<std::string, common_value>> commons() {
    return std::map<std::string, common_value>{};
  }
  /// The checkpoint's content metadata (`save_options::content_metadata`; Megatron's
  /// `content_metadata`), which `convert` carries over.
  virtual std::map<std::string, std::string> content_metadata() const { return {}; }
  /// Non-tensor items of the source: sharded objects (see `objects`) and items cairn cannot
  /// carry over (DCP bytes items of pickled Python values).
  virtual std::vector<std::string> other_items() const { return {}; }
  /// The sharded (per-rank) objects, by unique key (`rng/shard_0_4`: key, position and grid,
  /// see `object_unique_key`), with their bytes.
  virtual result<std::map<std::string, object_entry>> objects() {
    return std::map<std::string, object_entry>{};
  }
  /// How many ranks saved it, where the format records it.
  virtual std::optional<int> world_size() const { return std::nullopt; }

  /// The tensor called `key`, or nullptr.
  const tensor_entry* find(std::string_view key) const noexcept;
  /// Reads one box of tensor `key` into `out` (exactly the box's bytes).
  result<void> read_box(const std::string& key, const box& region, std::span<std::byte> out) {
    return read({box_read{key, region, out}});
  }
  /// Reads rows [begin, end) of axis 0 of tensor `key` (all other axes whole) into `out`.
  result<void> read_rows(const std::string& key,
                         std::int64_t begin,
                         std::int64_t end,
                         std::span<std::byte> out);
};

namespace detail {
/// Checks one request against its tensor (`t` null: no such tensor): the box inside the
/// tensor, `out` exactly its bytes. Errors name the key.
CAIRN_INLINE result<void> check_request(const tensor_entry* t, const box_read& r);

/// The bytes of each object of `m` on `st`, by unique key.
CAIRN_INLINE result<std::map<std::string, object_entry>> read_objects(storage_ref st,
                                                                      const checkpoint_metadata& m);
}  // namespace detail

/// A checkpoint whose reader describes it as cairn metadata (a native checkpoint, or a
/// safetensors one as `read_any_metadata` describes it), read through the box reader
/// (format/native/box_reader.hpp): only the checksum blocks the boxes touch are read, and
/// verified where the format has checksums. Flattened distributed-optimizer slices are boxes in
/// the metadata, so any box reassembles them.
class catalog_source final : public source {
 public:
  /// Reads the metadata of the checkpoint on `st` (which must outlive the source).
  static result<std::unique_ptr<catalog_source>> open(storage_ref st, int io_threads = 2);
  /// A source over metadata already in memory (a save that has not committed yet, say).
  static result<std::unique_ptr<catalog_source>> over(storage_ref st,
                                                      checkpoint_metadata m,
                                                      int io_threads = 2);
  std::string_view kind() const noexcept override { return m_.format; }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }
  result<void> read(const std::vector<box_read>& reqs) override;
  result<std::map<std::string, common_value>> commons() override;
  std::map<std::string, std::string> content_metadata() const override {
    return m_.content_metadata;
  }
  std::vector<std::string> other_items() const override { return objects_; }
  result<std::map<std::string, object_entry>> objects() override {
    return detail::read_objects(st_, m_);
  }
  std::optional<int> world_size() const override {
    return m_.verified() ? std::optional<int>(m_.world_size) : std::nullopt;
  }
  /// The metadata read.
  const checkpoint_metadata& metadata() const noexcept { return m_; }

 private:
  catalog_source(storage_ref st, int io_threads) : st_(st), io_threads_(io_threads) {}
  storage_ref st_;
  int io_threads_;
  buffer_pool pool_;  // read buffers, reused across reads
  checkpoint_metadata m_;
  std::vector<tensor_entry> tensors_;
  std::vector<std::string> objects_;
};

}  // namespace cairn::stream

#if CAIRN_HEADER_ONLY
#  include "cairn/format/stream/source-inl.hpp"
#endif
