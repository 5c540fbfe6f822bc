// cairn/format/native/strategy.hpp: the native format's save strategy, the default one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/writer.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/format/writers.hpp"
#include "cairn/plan/scalable.hpp"

namespace cairn {

namespace detail {

/// An object this rank writes, in its part of a partial index (scalable planning).
struct part_object {
  std::string unique_key;  ///< its key in the index (`object_unique_key`)
  std::string key;
  shape global_shape, global_offset;
  std::uint64_t byte_offset = 0, nbytes = 0;
};

/// A chunk this rank writes, in its part of a partial index (scalable planning).
struct part_chunk {
  std::string key;
  dtype type = dtype::f32;
  shape global_shape;
  box region;
  tile_counts tiles;
  std::uint64_t byte_offset = 0, nbytes = 0;
};

/// A rank's part of a partial index, in the order it writes: what rank 0 merges into the whole.
struct index_part_message {
  static constexpr std::string_view message_name = "index part";
  std::uint64_t bytes_of_rank = 0;
  std::vector<std::variant<part_object, part_chunk>> slots;
};

/// Where a compressed item's blocks went in its file.
struct compressed_placement {
  std::uint64_t file_offset = 0;
  std::vector<std::uint64_t> block_offsets, block_stored;
};

/// What `write` learned about one item: its checksums, and its blocks when compressed.
struct written_item {
  std::vector<std::uint64_t> checksums;
  std::optional<compressed_placement> compressed;
};

/// A rank's report of its write, for metadata.json (versions 1 to 3): its part of a partial
/// index, its data file's size and each item in slot order.
struct native_write_report {
  static constexpr std::string_view message_name = "write report";
  std::optional<index_part_message> part;
  bool compressed = false;
  std::uint64_t file_size = 0;
  std::vector<written_item> items;
};

/// An object as a version-4 report carries it: its index key, record and stored extent.
struct reported_object {
  std::string unique_key;
  std::string key;
  shape global_shape, global_offset;
  extent where;
};

/// One tensor's section in a rank's index file, as the manifest points to it.
struct reported_section {
  std::string key;
  dtype type = dtype::f32;
  shape global_shape;
  std::uint64_t offset = 0, length = 0, checksum = 0, chunks = 0;
};

/// The index file a rank wrote for the tensors it owns.
struct reported_index_file {
  std::uint64_t size = 0, checksum = 0;
  std::vector<reported_section> sections;
};

/// A rank's report of its write, for the version-4 manifest: whether it wrote a data file and
/// how large, its objects, and its index file when it owns tensors.
struct native_index_report {
  static constexpr std::string_view message_name = "index report";
  bool writes = false;
  std::uint64_t data_size = 0;
  std::vector<reported_object> objects;
  std::optional<reported_index_file> index;
};

/// The index sections a rank sends the owner of their keys (version 4's routing step).
struct routed_sections {
  static constexpr std::string_view message_name = "routed index sections";
  std::vector<bytes> sections;
};

}  // namespace detail

/// cairn's own format (docs/format.md): one data file per writing rank, chunks tiled into
/// checksum blocks, `metadata.json` written last by rank 0. The default strategy.
class native_strategy final : public save_strategy {
 public:
  std::string_view name() const noexcept override { return "native"; }
  /// Chunks larger than a block are tiled (unless `save_options::tile` is off); version 4
  /// (`index_files`) also cuts slabs along sharded axes and routes chunk records to the owners
  /// of their keys. Plans at scale.
  writer_features features(const save_options& opt) const noexcept override {
    writer_features f;
    f.tile = !opt.tile ? no_tiles : opt.index_files ? index_slabs : block_tiles;
    f.plans_at_scale = true;
    f.routes = opt.index_files;
    f.reads_device_items = true;
    return f;
  }
  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options& opt,
                     buffer_pool* buffers,
                     written_save& out) const override;
  /// Format version 4: this rank's chunk records (box, tiles, place, checksums) of each key
  /// go to the key's owner, as an index section (the index file's own encoding).
  std::vector<bytes> route(const planned_save& plan,
                           const written_save&,
                           const save_options&) const override;
  /// Format version 4: writes this rank's index file from the chunk records of the keys it
  /// owns (each section read back as a reader would), and reports to rank 0 its data file,
  /// its objects and where each owned tensor's directory is.
  result<void> receive_routed(planned_save& plan,
                              const std::vector<bytes>& routed,
                              storage_ref st,
                              const save_options& opt,
                              written_save& out) const override;
  result<void> commit(planned_save& plan,
                      written_save& w,
                      const std::vector<bytes>& reports,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options& opt) const override;
  /// The native metadata of a planned save, from every rank's write report: one data file per
  /// writing rank (in the order ranks first appear in the chunk list, then ranks with objects),
  /// the checksums of every chunk and object, for compressed saves also where each block went
  /// and the file sizes, and the lowest format version that holds it. No common state and no
  /// content metadata yet.
  static checkpoint_metadata metadata_of(const save_index& index,
                                         const std::string& save_id,
                                         const std::vector<bytes>& reports);
  /// The format version 4 manifest of a save, from every rank's report (`receive_routed`):
  /// data files in rank order, objects, then for each rank that owns tensors its index file
  /// and where each tensor's section lies. No common state and no content metadata yet.
  static checkpoint_metadata manifest_of(const save_index& index,
                                         const std::string& save_id,
                                         const std::vector<bytes>& reports);
  /// Rank `rank`'s part of a partial index, as its report carries it to rank 0.
  static detail::index_part_message part_of(const save_index& index, int rank);
  /// Adds rank `rank`'s part (`part_of`) to `whole`: its chunks after those of lower ranks.
  static void merge_part(const detail::index_part_message& part, int rank, save_index& whole);

 private:
  /// The metadata of a save before anything is in it: world size, save id, block size.
  static checkpoint_metadata empty_metadata(const save_index& index, const std::string& save_id);
  /// A planned extent as `write` left it: the item's checksums, and for a compressed item where
  /// its blocks went (`write_item::file_offset` is the extent's offset either way).
  static extent written_extent(const extent& planned, const write_item& it);
  /// metadata_of for an index that holds every rank's chunks.
  static checkpoint_metadata metadata_of_whole(const save_index& index,
                                               const std::string& save_id,
                                               const std::vector<bytes>& reports);

 public:
  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override;
  /// Committed when `metadata.json` is there and names this save's id.
  result<bool> committed(const planned_save& plan,
                         const written_save&,
                         storage_ref st) const override;

 private:
  /// What `write` leaves on this rank for the later steps.
  struct written_state {
    std::uint64_t file_size = 0;         ///< this rank's data file (compressed saves)
    std::optional<common_state> common;  ///< rank 0: the common state it wrote
    bool index_written = false;          ///< this rank's index file was put
  };
};

namespace detail {
inline const bool native_strategy_registered = register_save_strategy(
    "native", [] { return std::unique_ptr<save_strategy>(new native_strategy()); });
}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/strategy-inl.hpp"
#endif
