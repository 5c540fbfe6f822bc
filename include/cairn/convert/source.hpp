// cairn/convert/source.hpp: a readable checkpoint format seen as a list of tensors, each of which
// can be read box by box into caller memory — a cairn native checkpoint (through the public load
// API) or a PyTorch DCP checkpoint (`.metadata` + `__R_I.distcp`). What `unshard` and `convert`
// stream from. Notes in docs/unshard.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/comm/single.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/foreign.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/load.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/state_dict.hpp"

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
  /// Non-tensor items cairn leaves behind when converting (sharded objects, DCP bytes items).
  virtual std::vector<std::string> other_items() const { return {}; }

  /// The tensor called `key`, or nullptr.
  const tensor_entry* find(std::string_view key) const noexcept {
    const auto& ts = tensors();
    auto it = std::lower_bound(ts.begin(), ts.end(), key,
                               [](const tensor_entry& e, std::string_view k) { return e.key < k; });
    return it != ts.end() && it->key == key ? &*it : nullptr;
  }
  /// Reads one box of tensor `key` into `out` (exactly the box's bytes).
  result<void> read_box(const std::string& key, const box& region, std::span<std::byte> out) {
    return read({box_read{key, region, out}});
  }
  /// Reads rows [begin, end) of axis 0 of tensor `key` (all other axes whole) into `out`.
  result<void> read_rows(const std::string& key,
                         std::int64_t begin,
                         std::int64_t end,
                         std::span<std::byte> out) {
    const tensor_entry* t = find(key);
    if (!t) return make_error(errc::not_found, "no such tensor").with_key(key);
    if (t->global_shape.empty())
      return make_error(errc::invalid_argument, "a rank-0 tensor has no rows").with_key(key);
    box b{shape(t->global_shape.size(), 0), t->global_shape};
    b.offset[0] = begin;
    b.size[0] = end - begin;
    return read_box(key, b, out);
  }
};

namespace detail {
inline result<void> check_request(const tensor_entry* t, const box_read& r) {
  if (!t) return make_error(errc::not_found, "no such tensor").with_key(r.key);
  return check_box_read(t->global_shape, r.region, dtype_size(t->type), r.out.size(), r.key);
}
}  // namespace detail

/// A checkpoint read through cairn's load planner: a native checkpoint (or a safetensors one,
/// described by `read_any_metadata`). Each batch of boxes is loaded like a state_dict of
/// sharded tensors on one rank, so cairn reads (and, for the native format, verifies) only the
/// checksum blocks the boxes touch. Flattened distributed-optimizer slices are boxes in the
/// metadata, so any box reassembles them.
class native_source final : public source {
 public:
  /// Reads the metadata of the checkpoint on `st` (which must outlive the source).
  static result<std::unique_ptr<native_source>> open(storage_ref st, int io_threads = 2) {
    CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_any_metadata(st));
    return over(st, std::move(m), io_threads);
  }
  /// A source over metadata already in memory (a save that has not committed yet, say).
  static result<std::unique_ptr<native_source>> over(storage_ref st,
                                                     checkpoint_metadata m,
                                                     int io_threads = 2) {
    std::unique_ptr<native_source> s(new native_source(st, io_threads));
    for (const auto& [k, t] : m.tensors) s->tensors_.push_back({k, t.type, t.global_shape});
    for (const auto& [u, o] : m.objects) s->objects_.push_back(u);
    s->m_ = std::move(m);
    return s;
  }
  std::string_view kind() const noexcept override { return m_.format; }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }
  result<void> read(const std::vector<box_read>& reqs) override {
    state_dict sd;
    std::size_t n = 0;
    for (const auto& r : reqs) {
      const tensor_entry* t = find(r.key);
      CAIRN_TRY(detail::check_request(t, r));
      if (r.region.volume() == 0) continue;
      sharded_tensor<> st;
      st.key = r.key;
      st.type = t->type;
      st.local_shape = r.region.size;
      st.global_shape = t->global_shape;
      st.global_offset = r.region.offset;
      st.data = r.out;
      // The state_dict is keyed by tree path; two boxes of one tensor need two paths.
      sd.add(std::to_string(n++), st);
    }
    if (n == 0) return ok();
    load_options opt;
    opt.io_threads = io_threads_;
    load_stats stats;
    leaf_list leaves = flatten(sd);
    try {
      return cairn::detail::load_leaves_local(leaves, st_, m_, opt, stats, {}, &pool_);
    } catch (const exception& e) {
      return e.err();
    }
  }
  result<std::map<std::string, common_value>> commons() override {
    return cairn::read_commons(st_, m_);
  }
  std::vector<std::string> other_items() const override { return objects_; }
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
  static result<std::unique_ptr<dcp_source>> open(storage_ref st) {
    CAIRN_TRY_ASSIGN(dcp::reader rd, dcp::reader::open(st));
    std::unique_ptr<dcp_source> s(new dcp_source(std::move(rd)));
    for (const auto& [fqn, item] : s->reader_.meta().state_dict_metadata) {
      if (const auto* t = std::get_if<dcp::tensor_meta>(&item))
        s->tensors_.push_back({fqn, t->type, t->size});
      else
        s->others_.push_back(fqn);
    }
    return s;
  }
  std::string_view kind() const noexcept override { return "dcp"; }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }
  std::vector<std::string> other_items() const override { return others_; }
  /// The parsed `.metadata`.
  const dcp::metadata& metadata() const noexcept { return reader_.meta(); }

  result<void> read(const std::vector<box_read>& reqs) override {
    for (const auto& r : reqs) CAIRN_TRY(reader_.read_box(r.key, r.region, r.out));
    return ok();
  }

 private:
  explicit dcp_source(dcp::reader rd) : reader_(std::move(rd)) {}
  dcp::reader reader_;
  std::vector<tensor_entry> tensors_;
  std::vector<std::string> others_;
};

/// Opens whatever readable format is on `st`: a cairn checkpoint (`metadata.json` saying
/// `"format":"cairn"`), a DCP checkpoint (`.metadata`, with or without Megatron's
/// `metadata.json`), or safetensors (an index, or `model.safetensors`). Fails with
/// errc::incomplete_checkpoint when none is there.
inline result<std::unique_ptr<source>> open_source(storage_ref st) {
  CAIRN_TRY_ASSIGN(std::string format, detect_format(st));
  if (format == "torch_dist") {
    CAIRN_TRY_ASSIGN(auto s, dcp_source::open(st));
    return std::unique_ptr<source>(std::move(s));
  }
  if (format.empty())
    return make_error(errc::incomplete_checkpoint,
                      "not a readable checkpoint: no cairn metadata.json, no DCP "
                      ".metadata and no safetensors")
        .with_file(st.describe(""));
  CAIRN_TRY_ASSIGN(auto s, native_source::open(st));
  return std::unique_ptr<source>(std::move(s));
}

}  // namespace cairn::convert
