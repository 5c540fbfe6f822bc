// cairn/convert/source.hpp: a readable checkpoint format seen as a list of tensors, each of which
// can be read box by box into caller memory — a cairn native checkpoint (through the public load
// API) or a PyTorch DCP checkpoint (`.metadata` + `__R_I.distcp`). What `unshard` and `convert`
// stream from. Notes in docs/unshard.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/foreign.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/load.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::convert {

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

/// A checkpoint format that `unshard` and `convert` read from. Implementations read only the
/// bytes a request needs, so memory is bounded by what the caller asks for.
class source {
 public:
  virtual ~source() = default;
  /// "cairn" or "dcp".
  virtual std::string_view kind() const noexcept = 0;
  /// Every tensor, sorted by key.
  virtual const std::vector<tensor_entry>& tensors() const noexcept = 0;
  /// Fills every request (one pass over the storage for the whole batch where the format
  /// allows). Errors name the key and file.
  virtual result<void> read(const std::vector<box_read>& reqs) = 0;
  /// Common (non-tensor) values by path, where the format has them in a form cairn decodes
  /// (cairn: the common state; DCP: none).
  virtual result<std::map<std::string, common_value>> commons() {
    return std::map<std::string, common_value>{};
  }
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
CAIRN_INLINE result<void> check_request(const tensor_entry* t, const box_read& r);
}  // namespace detail

/// A checkpoint read through cairn's load planner: a native checkpoint (or a safetensors one,
/// described by `read_any_metadata`). Each batch of boxes is loaded like a state_dict of
/// sharded tensors on one rank, so cairn reads (and, for the native format, verifies) only the
/// checksum blocks the boxes touch. Flattened distributed-optimizer slices are boxes in the
/// metadata, so any box reassembles them.
class native_source final : public source {
 public:
  /// Reads the metadata of the checkpoint on `st` (which must outlive the source).
  static result<std::unique_ptr<native_source>> open(storage_ref st, int io_threads = 2);
  /// A source over metadata already in memory (a save that has not committed yet, say).
  static result<std::unique_ptr<native_source>> over(storage_ref st,
                                                     checkpoint_metadata m,
                                                     int io_threads = 2);
  std::string_view kind() const noexcept override { return m_.format; }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }
  result<void> read(const std::vector<box_read>& reqs) override;
  result<std::map<std::string, common_value>> commons() override {
    return cairn::read_commons(st_, m_);
  }
  std::vector<std::string> other_items() const override { return objects_; }
  result<std::map<std::string, object_entry>> objects() override;
  std::optional<int> world_size() const override {
    return m_.format == "cairn" ? std::optional<int>(m_.world_size) : std::nullopt;
  }
  /// The metadata read.
  const checkpoint_metadata& metadata() const noexcept { return m_; }

 private:
  native_source(storage_ref st, int io_threads) : st_(st), io_threads_(io_threads) {}
  storage_ref st_;
  int io_threads_;
  cairn::buffer_pool pool_;  // read buffers, reused across reads
  checkpoint_metadata m_;
  std::vector<tensor_entry> tensors_;
  std::vector<std::string> objects_;
};

/// A PyTorch Distributed Checkpoint (`.metadata` + `__R_I.distcp` files of `torch.save` items,
/// any torch version, Megatron's `torch_dist` backend included), read through `dcp::reader`
/// (the reader `load` uses too). A box is read from the items whose chunks it overlaps, each
/// item only over the byte span the box needs; strided items are read too.
class dcp_source final : public source {
 public:
  /// Reads and checks `.metadata` on `st` (which must outlive the source).
  static result<std::unique_ptr<dcp_source>> open(storage_ref st);
  std::string_view kind() const noexcept override { return "dcp"; }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }
  std::vector<std::string> other_items() const override { return others_; }
  /// Megatron's `common.pt` values (the `torch_dist` layout), as `read_any_metadata` reads them.
  result<std::map<std::string, common_value>> commons() override { return meta_.inline_commons; }
  /// The bytes items that hold cairn's sharded objects (a u8 tensor each).
  result<std::map<std::string, object_entry>> objects() override;
  /// The parsed `.metadata`.
  const dcp::metadata& metadata() const noexcept { return reader_.meta(); }

  result<void> read(const std::vector<box_read>& reqs) override;

 private:
  dcp_source(dcp::reader rd, storage_ref st) : reader_(std::move(rd)), st_(st) {}
  dcp::reader reader_;
  storage_ref st_;
  checkpoint_metadata meta_;  // its objects and common values, as `load` reads them
  std::vector<tensor_entry> tensors_;
  std::vector<std::string> others_;
};

/// Opens whatever readable format is on `st`: a cairn checkpoint (`metadata.json` saying
/// `"format":"cairn"`), a DCP checkpoint (`.metadata`, with or without Megatron's
/// `metadata.json`), or safetensors (an index, or `model.safetensors`). Fails with
/// errc::incomplete_checkpoint when none is there.
CAIRN_INLINE result<std::unique_ptr<source>> open_source(storage_ref st);

}  // namespace cairn::convert

#if CAIRN_HEADER_ONLY
#  include "cairn/convert/source-inl.hpp"
#endif
