// cairn/format/dcp/source.hpp: a PyTorch Distributed Checkpoint read as a `stream::source`, the
// box reader `convert` and `unshard` stream from (`load` reads DCP through `read_any_metadata`).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::dcp {

/// A PyTorch Distributed Checkpoint (`.metadata` + `__R_I.distcp` files of `torch.save` items,
/// any torch version, Megatron's `torch_dist` backend included), read through `dcp::reader`
/// (the reader `load` uses too). A box is read from the items whose chunks it overlaps, each
/// item only over the byte span the box needs; strided items are read too.
class source final : public stream::source {
 public:
  /// Reads and checks `.metadata` on `st` (which must outlive the source).
  static result<std::unique_ptr<source>> open(storage_ref st);
  std::string_view kind() const noexcept override { return "torch_dist"; }
  const std::vector<stream::tensor_entry>& tensors() const noexcept override { return tensors_; }
  std::vector<std::string> other_items() const override { return others_; }
  /// Megatron's `common.pt` values (the `torch_dist` layout), as `read_any_metadata` reads them.
  result<std::map<std::string, common_value>> commons() override { return meta_.inline_commons; }
  std::map<std::string, std::string> content_metadata() const override {
    return meta_.content_metadata;
  }
  /// The bytes items that hold cairn's sharded objects (a u8 tensor each).
  result<std::map<std::string, stream::object_entry>> objects() override {
    return stream::detail::read_objects(st_, meta_);
  }
  /// The parsed `.metadata`.
  const dcp::metadata& metadata() const noexcept { return reader_.meta(); }

  result<void> read(const std::vector<stream::box_read>& reqs) override;

 private:
  source(dcp::reader rd, storage_ref st) : reader_(std::move(rd)), st_(st) {}
  dcp::reader reader_;
  storage_ref st_;
  checkpoint_metadata meta_;  // its objects and common values, as `load` reads them
  std::vector<stream::tensor_entry> tensors_;
  std::vector<std::string> others_;
};

}  // namespace cairn::dcp

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/source-inl.hpp"
#endif
