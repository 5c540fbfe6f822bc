// cairn/format/safetensors/strategy.hpp: the safetensors save strategies (`one_file`,
// `per_tensor`, `chunks`): a native save of each rank's shard, then the ranks assemble the
// whole-tensor files in place, streaming from the shards (format/safetensors/stream_writer.hpp;
// format/safetensors/files.hpp plans the files).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/format/safetensors/stream_writer.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/format/writers.hpp"

namespace cairn {

/// Saves tensors as safetensors, whole (consolidated) whatever the sharding:
///
/// - `one_file`: one `model.safetensors`;
/// - `per_tensor`: one `<key>.safetensors` per tensor ('/' becomes '-'), plus the index;
/// - `chunks`: `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus
///   `model.safetensors.index.json` (Hugging Face's sharded layout).
///
/// Tensor names are the checkpoint keys. Every rank first writes its chunks as a native shard
/// file (checksummed, in parallel); then the output files are shared out among the ranks by
/// size and each rank builds its files streaming, reading the boxes it needs from the shards
/// (memory bounded by `slab_bytes`); rank 0 writes the index last and removes the shards. The
/// same state gives byte-identical files. Safetensors holds tensors only: trees with sharded
/// objects or common values are rejected. File names are fixed, so a committed checkpoint is
/// never replaced in place (save to a new place). The save's content metadata goes into each
/// file's `__metadata__`.
class safetensors_strategy final : public save_strategy {
 public:
  /// `split`: one_file, per_tensor or chunks; `chunk_size`: the most tensor bytes per file of
  /// `chunks`; `slab_bytes`: the most bytes each rank holds at once while assembling.
  explicit safetensors_strategy(safetensors::file_split split = safetensors::file_split::one_file,
                                std::uint64_t chunk_size = 5'000'000'000,
                                std::uint64_t slab_bytes = std::uint64_t{64} << 20);
  std::string_view name() const noexcept override { return safetensors::split_name(split_); }
  /// Builds its files in a second pass (`assemble`); never in place (fixed file names).
  writer_features features(const save_options&) const noexcept override {
    writer_features f;
    f.can_overwrite = false;
    f.assembles = true;
    f.reads_device_items = true;  // its shards are written by the native writer
    return f;
  }

  result<void> check(const leaf_list& leaves) const override;

  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options& opt,
                     buffer_pool* buffers,
                     written_save& out) const override;

  result<void> assemble(planned_save& plan,
                        const std::vector<bytes>& reports,
                        storage_ref st,
                        const save_options& opt,
                        written_save& out) const override;

  result<void> commit(planned_save& plan,
                      written_save&,
                      const std::vector<bytes>&,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options& opt) const override;

  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override;

  /// Committed when the index is there (`one_file` has nothing to commit after `assemble`).
  /// These formats never replace a checkpoint, so what is there is this save's.
  result<bool> committed(const planned_save&, const written_save&, storage_ref st) const override;

 private:
  /// The files' layout and `__metadata__` (the save's content metadata).
  safetensors::write_settings layout(const save_options& opt) const;
  /// The shard files as a native checkpoint (not committed anywhere: metadata in memory).
  static checkpoint_metadata shards(const planned_save& plan, const std::vector<bytes>& reports) {
    return native_strategy::metadata_of(plan.index, plan.save_id, reports);
  }
  /// The tensor bytes of a planned file.
  static std::uint64_t tensor_bytes(const safetensors::planned_file& f);
  /// Which rank writes each output file: largest first, onto the rank with the fewest bytes.
  static std::vector<int> owners(const std::vector<safetensors::planned_file>& files,
                                 std::size_t ranks);

  safetensors::file_split split_;
  std::uint64_t chunk_size_;
  std::uint64_t slab_bytes_;
  native_strategy native_;
};

namespace detail {
inline const bool safetensors_strategies_registered =
    register_save_strategy("one_file",
                           [] {
                             return std::unique_ptr<save_strategy>(
                                 new safetensors_strategy(safetensors::file_split::one_file));
                           }) &&
    register_save_strategy("per_tensor",
                           [] {
                             return std::unique_ptr<save_strategy>(
                                 new safetensors_strategy(safetensors::file_split::per_tensor));
                           }) &&
    register_save_strategy("chunks", [] {
      return std::unique_ptr<save_strategy>(
          new safetensors_strategy(safetensors::file_split::chunks));
    });
}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/safetensors/strategy-inl.hpp"
#endif
