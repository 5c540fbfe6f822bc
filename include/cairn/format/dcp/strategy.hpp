// cairn/format/dcp/strategy.hpp: the torch_dist save strategy: every rank writes its chunks as
// DCP items, rank 0 commits with Megatron's files and `.metadata` (format/dcp/writer.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/progress.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/format/writers.hpp"

namespace cairn {

namespace detail {

/// The bytes of `it`, in device memory, as a stream of staging window slots (one slot at a time,
/// each copied from the device and waited for before it is handed on).
CAIRN_INLINE torch_zip::byte_stream device_stream(const write_item& it,
                                                  cuda::staging_window& window);

/// Where one item went in a rank's `.distcp` file.
struct stored_item {
  std::uint64_t offset = 0, length = 0;
};

/// A rank's report of its DCP write: each item's place, in slot order.
struct dcp_write_report {
  static constexpr std::string_view message_name = "DCP write report";
  std::vector<stored_item> items;
};

}  // namespace detail

/// Saves in the PyTorch Distributed Checkpoint format that Megatron-core's `torch_dist` backend
/// also uses, so `torch.distributed.checkpoint.load` and Megatron load it:
///
/// - every rank writes `__<rank>_0.<save id>.distcp`: one `torch.save` archive per chunk it
///   writes (chunks are N-d boxes, so flattened optimizer slices become the boxes they cover);
/// - sharded objects become DCP bytes items named by their unique key (`rng/shard_0_4`), each
///   a `torch.save` of a uint8 tensor of the object's encoded bytes;
/// - rank 0 writes Megatron's `common.pt` (common values as Python values) and
///   `metadata.json`, and `.metadata` last: the commit.
///
/// A committed checkpoint is never replaced in place: `common.pt` has a fixed name, so a save
/// over a committed checkpoint could leave one generation's `.metadata` beside another's common
/// values. Save every checkpoint to a new place, as Megatron does. DCP has no checksums: `load`
/// reads this format unverified.
class torch_dist_strategy final : public save_strategy {
 public:
  /// `f`: which torch module paths `.metadata` names (torch 2.x, or 1.13's prototype).
  explicit torch_dist_strategy(dcp::flavor f = dcp::flavor::torch2) : flavor_(f) {}
  std::string_view name() const noexcept override { return "torch_dist"; }
  /// No tiles, a whole index, never in place (see above).
  writer_features features(const save_options&) const noexcept override {
    writer_features f;
    f.can_overwrite = false;
    f.reads_device_items = true;
    return f;
  }

  /// Refuses, before anything is written, tensors whose dtype the flavor's torch lacks.
  result<void> check(const leaf_list& leaves) const override;

  /// The data file of `rank` for a save id.
  static std::string data_name(int rank, const std::string& save_id) {
    return "__" + std::to_string(rank) + "_0." + save_id + ".distcp";
  }

  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options& opt,
                     buffer_pool*,
                     written_save& out) const override;

  result<void> commit(planned_save& plan,
                      written_save& w,
                      const std::vector<bytes>& reports,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options&) const override;

  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override;

  /// Committed when `.metadata` is there and names this save's data files.
  result<bool> committed(const planned_save& plan,
                         const written_save&,
                         storage_ref st) const override;

 private:
  dcp::flavor flavor_;
};

namespace detail {
inline const bool torch_dist_strategy_registered = register_save_strategy(
    "torch_dist", [] { return std::unique_ptr<save_strategy>(new torch_dist_strategy()); });
}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/strategy-inl.hpp"
#endif
