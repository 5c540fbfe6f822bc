// cairn/pipeline/save.hpp: the phases of a save. Plan (collective): describe this rank's leaves,
// agree on the plan, list this rank's items. Write (local): the strategy writes them. Commit
// (collective): every rank's status is shared, rank 0 commits, everyone learns how that went.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/options.hpp"
#include "cairn/pipeline/scalable_plan.hpp"
#include "cairn/plan/plan_cache.hpp"
#include "cairn/plan/save_plan.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// A fresh id for a save's file names (12 hex digits).
CAIRN_INLINE std::string new_save_id();

/// The strategy of a save (the native one when none is set).
CAIRN_INLINE const save_strategy& strategy_of(const save_options& opt);

/// A storage that records the objects written through it (puts and writers that finished),
/// for `save_stats::files`. Thread-safe: a save's I/O threads write through it at once.
class recording_storage {
 public:
  explicit recording_storage(storage_ref inner) : inner_(inner) {}

  /// What the wrapped backend guarantees.
  storage_features features() const { return inner_.features(); }
  /// Forwarded; recorded when it succeeds.
  result<void> put(std::string_view name, std::span<const std::byte> data);
  /// Forwarded; the object is recorded when its writer finishes.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name);
  /// Forwarded.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    return inner_.read(name, offset, out);
  }
  /// Forwarded.
  result<std::uint64_t> size(std::string_view name) { return inner_.size(name); }
  /// Forwarded.
  result<bool> exists(std::string_view name) { return inner_.exists(name); }
  /// Forwarded.
  result<std::vector<std::string>> list(std::string_view prefix) { return inner_.list(prefix); }
  /// Forwarded; a recorded object that is removed (an abandoned save) is forgotten.
  result<void> remove(std::string_view name);
  /// Forwarded.
  std::string describe(std::string_view name) const { return inner_.describe(name); }
  /// Forwarded.
  result<std::size_t> remove_temporaries(std::string_view prefix) {
    return inner_.remove_temporaries(prefix);
  }
  /// The objects written that are still there (another rank may have removed some: the
  /// safetensors strategies remove their shards once assembled), in the order they were
  /// finished.
  std::vector<std::string> names() const;

 private:
  class recording_writer final : public object_writer {
   public:
    recording_writer(std::unique_ptr<object_writer> w, recording_storage& owner, std::string name)
        : w_(std::move(w)), owner_(owner), name_(std::move(name)) {}
    result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
      return w_->write_at(offset, data);
    }
    result<void> finish() override;

   private:
    std::unique_ptr<object_writer> w_;
    recording_storage& owner_;
    std::string name_;
  };

  void record(std::string_view name);

  storage_ref inner_;
  mutable std::mutex mu_;
  std::vector<std::string> names_;
};

/// The options a save runs with: `opt`, with `index_files` off when the strategy does not
/// route its reports (format version 4 is the native strategy's, and a user's strategy that
/// wraps the native one without forwarding `routes` gets the version it was written for).
CAIRN_INLINE save_options effective_options(const save_options& opt);

/// Checks the options every rank passes alike (so every rank fails alike, without talking).
CAIRN_INLINE result<void> check_save_options(const save_options& opt);

/// Fails unless every key, path and content-metadata string of the save is valid UTF-8 (they
/// become JSON strings).
CAIRN_INLINE result<void> check_utf8_names(const leaf_list& leaves, const save_options& opt);

/// Plan step 1 (local): describes this rank's leaves for the others, encodes its objects and
/// common values into `out`, and returns each tensor leaf's pieces. Rank 0 also proposes the
/// save id and says whether a checkpoint of any format is already committed in `st`.
CAIRN_INLINE result<std::vector<std::vector<piece>>> describe_rank(const leaf_list& leaves,
                                                                   storage_ref st,
                                                                   const save_options& opt,
                                                                   planned_save& out,
                                                                   rank_desc& me);

/// What the ranks agreed on in plan step 2.
struct agreed_plan {
  std::optional<save_index> cached;  ///< the plan cache's index, when every rank matched it
  bool exists_at_root = false;       ///< rank 0 found a committed checkpoint
  std::string save_id;               ///< rank 0's save id
};

/// The smallest world in which a save plans by key owners unless told otherwise
/// (`save_options::scalable_planning` unset): below it one all-gather of every rank's
/// description is quicker (docs/benchmarks.md, "Planning by default").
inline constexpr int key_owner_planning_min_ranks = 4;

/// Whether a save under `o` on `world_size` ranks plans by key owners: as
/// `o.scalable_planning` says, or when it is unset, when the strategy plans at scale and the
/// world has at least `key_owner_planning_min_ranks` ranks.
CAIRN_INLINE bool plans_by_key_owners(const save_options& o, int world_size);

/// The settings of `o` on `world_size` ranks that a cached plan depends on.
CAIRN_INLINE plan_settings settings_of(const save_options& o, int world_size);

/// What each rank sends rank 0 with a warm plan cache: hashes of its structure and its commons,
/// and when the cached plan has common values held by a group of ranks, each of its common
/// values (paths and hashes: rank 0 checks that the ranks declaring one agree).
struct plan_vote_message {
  static constexpr std::string_view message_name = "plan cache vote";
  std::uint64_t structure = 0;
  std::uint64_t commons_digest = 0;
  std::vector<common_desc> commons;
};

/// Rank 0's answer to the votes: whether every rank matched, and what rank 0 knows.
struct plan_verdict_message {
  static constexpr std::string_view message_name = "plan cache verdict";
  bool same = false;
  bool checkpoint_exists = false;
  std::string save_id;
};

/// Plan step 2 with a warm plan cache (collective, a few dozen bytes per rank; with common
/// values held by a group of ranks, their paths and hashes too): every rank sends rank 0 a hash
/// of its structure and of its common values; rank 0 compares them with the cached plan and
/// tells every rank the verdict, its save id and whether a checkpoint exists.
/// Sets `cached` when every rank matches the cached plan.
CAIRN_INLINE result<void> vote_on_cached_plan(const rank_desc& me,
                                              const std::optional<error>& failure,
                                              save_plan_cache& cache,
                                              comm_ref comm,
                                              const save_options& opt,
                                              agreed_plan& out);

/// What a rank sends rank 0 after planning when the save has common values held by a group of
/// ranks: the values `save_index::common_holders` names it for.
struct held_commons_message {
  static constexpr std::string_view message_name = "group-held common values";
  std::vector<std::pair<std::string, common_value>> values;
};

/// Plan step 3, only when the plan names common values held by a group of ranks (collective):
/// each such value's holder sends it to rank 0, which adds them to its `out.commons` (the
/// common state it writes).
CAIRN_INLINE result<void> gather_held_commons(planned_save& out, comm_ref comm);

/// Refuses to replace a committed checkpoint unless asked to and the strategy can.
CAIRN_INLINE result<void> check_overwrite(bool exists_at_root,
                                          storage_ref st,
                                          const save_options& opt);

/// Plan step 2 without a usable cached plan (collective): every rank's description reaches
/// every rank, which validates and plans alike.
CAIRN_INLINE result<save_index> plan_everywhere(const rank_desc& me,
                                                const std::optional<error>& failure,
                                                storage_ref st,
                                                comm_ref comm,
                                                const save_options& opt,
                                                save_stats& stats);

/// Plan step 2 without a usable cached plan, at scale (`save_options::scalable_planning`,
/// collective): planned by key owners (pipeline/scalable_plan.hpp); the index holds only this
/// rank's chunks and objects.
CAIRN_INLINE result<save_index> plan_at_scale(const rank_desc& me,
                                              const std::optional<error>& failure,
                                              storage_ref st,
                                              comm_ref comm,
                                              const save_options& opt,
                                              save_stats& stats);

/// Plan step 2 (collective): agrees on the save index, from the plan cache when every rank's
/// structure is unchanged (validated when it was planned; common values compared by digest),
/// otherwise by `plan_at_scale` when `plans_by_key_owners`, else by `plan_everywhere`.
/// Fails on every rank alike.
CAIRN_INLINE result<save_index> agree_on_index(const rank_desc& me,
                                               const std::optional<error>& failure,
                                               storage_ref st,
                                               comm_ref comm,
                                               const save_options& opt,
                                               save_stats& stats);

/// Plan step 3 (local): this rank's write items, in the order of its slots.
CAIRN_INLINE void list_items(const leaf_list& leaves,
                             const std::vector<std::vector<piece>>& pieces,
                             planned_save& out);

/// Phase 1 of a save (collective): describe this rank's leaves, agree on the plan (or reuse
/// the cached one), and list this rank's write items. A `local_failure` (staging failed) is
/// shared with every rank. Fails on every rank alike.
CAIRN_INLINE result<void> plan_phase(const leaf_list& leaves,
                                     storage_ref st,
                                     comm_ref comm,
                                     const save_options& opt,
                                     planned_save& out,
                                     const std::optional<error>& local_failure = std::nullopt);

/// Phase 2 of a save (local, no communication): the strategy writes this rank's part.
/// Failures are returned for the commit to share; this rank's files are removed.
CAIRN_INLINE written_save write_phase(planned_save& plan,
                                      storage_ref st,
                                      const save_options& opt,
                                      buffer_pool* buffers = nullptr);

/// Commit step 2 (every rank, after every write succeeded): the strategy's second local pass,
/// shared like the writes. Returns every rank's assemble report.
CAIRN_INLINE result<std::vector<bytes>> assemble_step(planned_save& plan,
                                                      written_save& w,
                                                      const std::vector<bytes>& reports,
                                                      storage_ref st,
                                                      comm_ref comm,
                                                      const save_options& opt);

/// How rank 0's commit went.
struct commit_outcome {
  std::optional<error> failure;  ///< the commit did not take effect (or may not have)
  bool unknown = false;          ///< whether it took effect is unknown: remove nothing
};

/// Commit step 3 on rank 0: the strategy commits. A failed commit may still have happened (a
/// lost acknowledgement): storage is read back before anyone removes anything; when even that
/// fails, the outcome is unknown and nothing is removed.
CAIRN_INLINE commit_outcome commit_on_root(planned_save& plan,
                                           written_save& w,
                                           const std::vector<bytes>& reports,
                                           const std::vector<bytes>& assembled,
                                           storage_ref st,
                                           const save_options& opt);

/// Commit step 2' for a strategy that routes its reports (collective): once rank 0 knows every
/// write succeeded, each rank sends each rank what the strategy routes to it (`all_to_all`) and
/// the strategy takes what it received. Failures land in `w.failure` (this rank's files are then
/// removed), for `commit_at_root` to share; a failed write anywhere skips the exchange.
CAIRN_INLINE void route_step(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt);

/// Phase 3 of a save for a strategy that does not assemble (collective, each rank's report goes
/// to rank 0 only): statuses and reports meet at rank 0, which commits when every rank succeeded
/// and tells everyone how that went.
CAIRN_INLINE result<void> commit_at_root(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt);

/// Phase 3 of a save (collective): share every rank's status and report; let the strategy
/// assemble (when it does) and share again; when all succeeded, rank 0 commits (metadata
/// last) and tells everyone how that went. A strategy that does not assemble sends its reports
/// to rank 0 only (`commit_at_root`).
CAIRN_INLINE result<save_stats> commit_phase(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/save-inl.hpp"
#endif
