// cairn/format/save_strategy.hpp: the interface every format writer implements. Planning is
// shared (pipeline/save.hpp); a strategy turns the planned chunks into files and commits them.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/save_plan.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::cuda {
class staging_window;
}  // namespace cairn::cuda

namespace cairn {

/// One item this rank writes: source bytes and destination in its data file. A tiled item
/// (`tiles` not empty) is the row-major box `region` at `src`, written tile by tile.
struct write_item {
  const std::byte* src;                  ///< the item's bytes (row-major `region` when tiled)
  std::uint64_t nbytes;                  ///< how many
  std::uint64_t file_offset;             ///< where they go in this rank's data file
  std::string key;                       ///< tensor or object key (for errors)
  std::vector<std::uint64_t> checksums;  ///< per block (or tile), set by the writer
  box region;                            ///< the chunk's box (tiled items)
  tile_counts tiles;                     ///< how the chunk is tiled; empty: written as it is
  std::size_t elem_size = 1;
  bool is_object = false;  ///< a sharded object's encoded bytes (owned by the save)
  /// `src` is device memory: the writer reads it piece by piece through
  /// `planned_save::window`, never directly (only for strategies that `reads_device_items`).
  bool on_device = false;
  /// Compressed writes: where each block (or tile) went and its stored length (see `extent`).
  std::vector<std::uint64_t> block_offsets = {}, block_stored = {};
};

/// A save after planning, as a strategy sees it: the save index (every tensor's chunks and
/// which rank writes each), and what this rank writes where, in `index.slots[rank]` order.
/// Tensor items point into the user's memory (or, for an async save, into the staging pool);
/// objects and common values are owned copies.
struct planned_save {
  save_index index;                 ///< the plan every rank agreed on
  std::string save_id;              ///< the id in this save's names
  int rank = 0;                     ///< this rank
  std::vector<write_item> items;    ///< this rank's items, in order
  std::vector<bytes> object_bytes;  ///< encoded objects, leaf order
  /// path -> value: this rank's common values; on rank 0, which saves them, also those held by
  /// a group of ranks without rank 0 (sent by their holders after planning).
  std::vector<std::pair<std::string, common_value>> commons;
  save_stats stats;                             ///< this rank's statistics
  std::chrono::steady_clock::time_point start;  ///< when the save began
  /// Host staging memory for the items `on_device` (set when some are): the writer takes a
  /// slot, copies a piece of at most `piece_bytes()` into it, writes it and gives it back.
  cuda::staging_window* window = nullptr;
};

/// What the write step of one rank leaves for the commit (its report, strategy state, failure).
struct written_save {
  std::optional<error> failure;  ///< this rank's write failed (set by the pipeline)
  /// Sent to every rank after the write (native: this rank's checksums), then handed to the
  /// strategy's `assemble` and `commit`.
  bytes report;
  /// Sent to every rank after `assemble`.
  bytes assemble_report;
  /// Whatever the strategy keeps on this rank between phases.
  std::any local;
};

/// What a writer can do and which optional steps of a save it runs: one value, asked once per
/// save, instead of a yes/no question per feature. The defaults describe the simplest writer:
/// no tiles, a whole index, overwrite allowed, no second pass.
struct writer_features {
  /// How planning cuts chunks into tiles (only formats that record tiles can hold them).
  tiling tile = no_tiles;
  /// Works with a partial index (`save_options::scalable_planning`): each rank's
  /// `planned_save::index` then holds only its own chunks and objects.
  bool plans_at_scale = false;
  /// `save_options::overwrite` may replace a committed checkpoint in place.
  bool can_overwrite = true;
  /// Runs step 2, `assemble`.
  bool assembles = false;
  /// Runs step 2', `route` and `receive_routed` (only when it does not assemble).
  bool routes = false;
  /// Reads items in device memory (`write_item::on_device`) through `planned_save::window`
  /// piece by piece, so a synchronous save of device tensors stages at most the window
  /// (`save_options::staging_window`). Without it the save first copies every device tensor
  /// of the rank into host staging memory and the writer sees host memory only.
  bool reads_device_items = false;
};

/// A save strategy: how the chunks a save planned become files, and what metadata says where
/// they are. Storage stays separate (any backend works). Planning is shared by every strategy:
/// replicas are deduplicated, writes balanced across ranks, access integrity checked. A
/// strategy then runs three steps:
///
/// 1. `write` (every rank, in parallel, no communication): writes this rank's items and
///    leaves a `report` that every rank receives;
/// 2. `assemble` (optional, every rank, after every write succeeded): a second local pass that
///    may read what other ranks wrote (safetensors builds its files here);
/// 3. `commit` (rank 0, after every rank succeeded): writes the metadata that makes the
///    checkpoint visible, last.
///
/// A failure anywhere reaches every rank; `abandon` then removes what this rank wrote. The
/// built-in strategies are `native_strategy` (here) and, in `cairn/strategies.hpp`,
/// `torch_dist_strategy` and `safetensors_strategy`. Write your own by deriving from this
/// class; an instance must outlive the saves that use it and is shared across threads.
class save_strategy {
 public:
  virtual ~save_strategy() = default;
  /// The strategy's name ("native", "torch_dist", "one_file", ...).
  virtual std::string_view name() const noexcept = 0;
  /// What this writer does under `opt` (`writer_features`); the default is the simplest writer.
  virtual writer_features features(const save_options& opt) const noexcept {
    (void)opt;
    return {};
  }
  /// Checks this rank's leaves before planning (a format that holds tensors only rejects
  /// objects here). Called on every rank; a failure reaches every rank.
  virtual result<void> check(const leaf_list& leaves) const;
  /// Step 1: writes this rank's items (`plan.items`, in `plan.index.slots[plan.rank]` order)
  /// and sets `out.report`.
  virtual result<void> write(planned_save& plan,
                             storage_ref st,
                             const save_options& opt,
                             buffer_pool* buffers,
                             written_save& out) const = 0;
  /// Step 2 (when `features().assembles`), with every rank's write report (indexed by rank); sets
  /// `out.assemble_report`.
  virtual result<void> assemble(planned_save& plan,
                                const std::vector<bytes>& reports,
                                storage_ref st,
                                const save_options& opt,
                                written_save& out) const;
  /// Step 2' (when `features().routes` and the strategy does not assemble; every rank, after
  /// every write succeeded): reports go to the ranks that own keys rather than to every rank
  /// (format version 4 writes its index files that way). What this rank sends each rank, by
  /// rank (`plan.index.world_size` buffers).
  virtual std::vector<bytes> route(const planned_save& plan,
                                   const written_save& w,
                                   const save_options& opt) const;
  /// Step 2'' with what every rank routed to this one (by rank): a local pass that may write
  /// files and sets `out.report`, which then goes to rank 0's `commit`.
  virtual result<void> receive_routed(planned_save& plan,
                                      const std::vector<bytes>& routed,
                                      storage_ref st,
                                      const save_options& opt,
                                      written_save& out) const;
  /// Step 3 on rank 0: writes the metadata, last, from every rank's reports.
  virtual result<void> commit(planned_save& plan,
                              written_save& w,
                              const std::vector<bytes>& reports,
                              const std::vector<bytes>& assemble_reports,
                              storage_ref st,
                              const save_options& opt) const = 0;
  /// Removes what this rank wrote for a save that failed (best effort).
  virtual void abandon(const planned_save& plan, const written_save& w, storage_ref st) const {
    (void)plan, (void)w, (void)st;
  }
  /// Called on rank 0 when `commit` failed: whether storage holds this save's commit anyway
  /// (the write happened but its acknowledgement was lost: a dropped server reply, a rename
  /// whose directory fsync failed). `true`: the save is committed after all; `false`: it is
  /// not, and every rank may `abandon` what it wrote; an error: the outcome is unknown, and
  /// nothing is removed (the next successful save removes what is left). The default answers
  /// "unknown", which is always safe.
  virtual result<bool> committed(const planned_save& plan,
                                 const written_save& w,
                                 storage_ref st) const;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/save_strategy-inl.hpp"
#endif
