// cairn/manager/checkpointer.hpp: the checkpoint manager a trainer constructs once and calls
// every N steps. Checkpoints live under one root (a directory, an S3 prefix, any storage), one
// per name from a template ("step{step:08}"); a pointer object `latest` names the newest, moved
// only after that checkpoint commits (also for async saves); named tags point at others;
// retention deletes old checkpoints only after a new one commits and never the one a pointer
// names; `load_latest` resumes from the pointer, or from the newest committed checkpoint when
// the pointer is missing or stale (one rank lists the root, every rank gets its answer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/async/saver.hpp"
#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/manager/names.hpp"
#include "cairn/options.hpp"
#include "cairn/storage/pointer.hpp"
#include "cairn/storage/prefixed.hpp"

namespace cairn {

class any_storage;

/// Options of a `checkpointer`.
struct checkpointer_options {
  /// The name of each checkpoint under the root (see `name_template`).
  std::string name = "step{step:08}";
  /// The pointer object under the root that names the newest committed checkpoint.
  std::string latest = "latest";
  /// Keep the newest `keep_last` checkpoints of this template (0: keep all). Older ones are
  /// deleted after a newer one commits, unless kept for another reason below.
  int keep_last = 0;
  /// Also keep every checkpoint whose step is a multiple of `keep_every` (0: none for this).
  std::int64_t keep_every = 0;
  /// Save in the background: `save` returns after staging; the checkpoint commits, `latest`
  /// moves and retention runs from the background thread once every rank has written (where
  /// the communicator has a duplicate: see `async_saver`), else at the next `save` or at
  /// `finalize`.
  bool async = false;
  /// Replace a committed checkpoint of the same name (OLMo-core's `save_overwrite`); without
  /// it such a save fails and the checkpoint stays.
  bool overwrite = false;
  /// Options of every save. The checkpointer sets `plan_cache` (its own, unless one is given),
  /// `staging` (likewise), `overwrite` and the counters in `content_metadata`.
  save_options save;
  /// Options of the async saver (`async`).
  async_saver_options async_options;
};

/// A checkpoint that committed, and what followed: `latest` (and the tags asked for) moved to
/// it, then retention ran.
struct committed_checkpoint {
  std::string name;                     ///< its name under the root
  save_stats stats;                     ///< of its save
  std::vector<std::string> deleted;     ///< the checkpoints retention deleted after it
  std::vector<error> retention_errors;  ///< deletions that failed (reported, never fatal)
};

/// What `checkpointer::save` did.
struct saved_checkpoint {
  std::string name;  ///< the checkpoint this call saved (or, async, started)
  /// What committed during this call: this checkpoint (synchronous), or the previous async one.
  std::optional<committed_checkpoint> committed;
  /// Async: the previous save failed at its commit; it is not loadable and `latest` did not
  /// move. This call's save was started all the same.
  std::optional<error> previous_failure;
};

/// What `checkpointer::load_latest` loaded.
struct loaded_checkpoint {
  std::string name;              ///< the checkpoint's name under the root
  checkpoint_counters counters;  ///< where training was when it was saved
  load_stats stats;              ///< of the load
  /// The pointer was missing or named something incomplete: the checkpoint was found by
  /// listing the root.
  bool found_by_scan = false;
};

/// A checkpoint found under a root (`list_checkpoints`).
struct checkpoint_entry {
  std::string name;       ///< its name under the root
  std::string format;     ///< "cairn", "torch_dist", "safetensors"; empty while incomplete
  bool complete = false;  ///< committed: its metadata is there
  /// The counters its name holds by the template (nullopt: not a name of this template).
  std::optional<checkpoint_counters> counters;
  bool latest = false;            ///< the `latest` pointer names it
  std::vector<std::string> tags;  ///< the tags that name it
  std::uint64_t bytes = 0;        ///< the size of its objects
  std::size_t objects = 0;        ///< how many objects it has
};

namespace detail {

/// The directory of tag pointers under a root.
inline constexpr std::string_view tags_prefix = "tags/";

/// The checkpoint names found in a listing of a root (first path components that have
/// objects below them), each with its objects' names relative to it.
CAIRN_INLINE std::map<std::string, std::vector<std::string>> group_by_checkpoint(
    const std::vector<std::string>& names);

/// Whether `files` (of one checkpoint) hold a commit marker (`is_commit_marker`: the native
/// format's or a registered format's).
CAIRN_INLINE bool has_commit_marker(const std::vector<std::string>& files);

/// Counters as content metadata ("cairn.step", ...), and back.
CAIRN_INLINE void put_counters(std::map<std::string, std::string>& m, const checkpoint_counters& c);

CAIRN_INLINE std::optional<checkpoint_counters> get_counters(
    const std::map<std::string, std::string>& m);

/// Rank 0's answer to "which checkpoint is that?": its name and counters.
struct resolved_message {
  static constexpr std::string_view message_name = "resolved checkpoint";
  std::string name;
  checkpoint_counters counters;
};

/// What each rank proposes to name a save: the checkpoint's name and its tags.
struct proposed_name_message {
  static constexpr std::string_view message_name = "proposed checkpoint name";
  std::string name;
  std::vector<std::string> tags;
};

/// Rank 0's report of a publish: the checkpoints retention deleted, and what it could not.
struct published_message {
  static constexpr std::string_view message_name = "publish report";
  std::vector<std::string> deleted;
  std::vector<error> retention_errors;
};

/// Rank 0's answer to "which is the latest?": its name and whether it was found by scanning.
using latest_message = std::optional<std::pair<std::string, bool>>;

/// Newest first: by step, then epoch, batch, sample, token, then name.
CAIRN_INLINE bool newer(const checkpoint_entry& a, const checkpoint_entry& b);

}  // namespace detail

/// The checkpoints under `root`, by name (one `list` of the root, plus one small read per
/// pointer): complete or not, the counters their names hold by `names` (null: none parsed), and
/// which the pointer `latest` and the tags name. With `measure`, also each complete one's format
/// (its metadata read) and every object's size (a HEAD each on S3); without, `complete` says
/// only that a commit marker is there and `format` and `bytes` stay empty (what retention and
/// `load_latest` need, at one listing).
CAIRN_INLINE result<std::vector<checkpoint_entry>> list_checkpoints(
    storage_ref root,
    const name_template* names,
    std::string_view latest = "latest",
    bool measure = true);

/// Deletes checkpoint `name` under `root`: its commit marker first (from then on it reads as
/// incomplete), then every other object, then what puts killed in it left (hidden temporaries
/// of file storage). Stops at the first failure. Nothing may be writing into it.
CAIRN_INLINE result<void> remove_checkpoint(storage_ref root, const std::string& name);

/// The checkpoint manager: one per rank, constructed once from a root storage and a
/// communicator and called every N steps. It owns the plan cache, the staging pool and the
/// async saver that a trainer would otherwise thread through by hand.
///
/// ```
/// cairn::file_storage root("/ckpt/run1");
/// cairn::checkpointer ckpt(root, comm, {.name = "step{step:08}", .keep_last = 3});
/// if (auto r = ckpt.load_latest(state).value()) start = r->counters.step;
/// for (std::int64_t step = start; step < steps; ++step) {
///   train_step();
///   if ((step + 1) % 100 == 0) ckpt.save(state, {.step = step + 1});
/// }
/// ckpt.finalize();
/// ```
///
/// Every member that takes a communicator step is collective: every rank calls it, in the same
/// order. The root storage and the communicator must outlive the checkpointer.
class checkpointer {
 public:
  /// A manager of the checkpoints under `root`. Throws cairn::exception (invalid_argument) when
  /// `opt` is not valid (a bad name template, a pointer name that is not a valid object name).
  checkpointer(storage_ref root, comm_ref comm, checkpointer_options opt = {});

  /// A manager of the checkpoints under the storage `root_uri` names (a path, file://,
  /// memory://, s3:// with cairn/storage/s3.hpp included), which it opens and owns. Throws
  /// cairn::exception when the URI cannot be opened or `opt` is not valid.
  checkpointer(std::string_view root_uri, comm_ref comm, checkpointer_options opt = {});

  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;

  /// Waits for an async save in flight: committed and published in the background, it stays.
  /// One that could not commit (it failed, or nothing commits in the background and no
  /// `finalize` came) is not loadable and `latest` stays where it was; that is reported
  /// (stderr, and `checkpointer_options::async_options.on_dropped`).
  ~checkpointer();

  /// Saves `tree` as the checkpoint the template names for `at` (collective). Every rank must
  /// name the same checkpoint and ask for the same `tags`: checked across ranks before anything
  /// is written (errc::invalid_argument naming the ranks that differ). Once the checkpoint
  /// commits, the `latest` pointer and the pointers `tags/<tag>` of `tags` name it, then
  /// retention runs. Async: a save still in flight is committed (and published) first; this
  /// one is started and commits at the next `save` or `finalize`.
  template <class Tree>
  result<saved_checkpoint> try_save(const Tree& tree,
                                    const checkpoint_counters& at,
                                    const std::vector<std::string>& tags = {}) {
    return save_flattened([&] { return flatten(const_cast<Tree&>(tree)); }, at, tags);
  }

  /// `try_save` that throws cairn::exception on failure.
  template <class Tree>
  saved_checkpoint save(const Tree& tree,
                        const checkpoint_counters& at,
                        const std::vector<std::string>& tags = {}) {
    auto r = try_save(tree, at, tags);
    if (!r) throw exception(r.err());
    return std::move(*r);
  }

  /// Waits for the async save in flight, if any, commits and publishes it when the background
  /// thread did not (collective); returns it, or nullopt when none was in flight. Call it
  /// before the program ends to learn how the last save went.
  result<std::optional<committed_checkpoint>> finalize();

  /// Whether an async save was started and its result not yet collected (by `finalize` or the
  /// next `save`).
  bool in_flight() const noexcept;

  /// Whether the async save in flight has been written by this rank, without blocking. False
  /// with none in flight.
  bool written() const noexcept;

  /// Whether the async save in flight is settled on this rank, without blocking: committed,
  /// `latest` moved and retention run by the background thread (or failed); the next `save`
  /// or `finalize` then only collects the result. False with none in flight, and until
  /// `finalize` where nothing commits in the background.
  bool done() const noexcept;

  /// The newest committed checkpoint (collective): the one the `latest` pointer names when it
  /// is committed, else the newest committed one whose name is of the template, found by one
  /// listing of the root on rank 0. Nullopt when there is none. Fails (errc::not_found) when
  /// the root holds committed checkpoints but none of the template's names, rather than start
  /// from scratch beside them.
  result<std::optional<std::pair<std::string, bool>>> find_latest();

  /// Loads the newest committed checkpoint (`find_latest`) into `tree` (collective): which one
  /// and the counters it was saved at, or nullopt when the root holds none (a fresh start).
  template <class Tree>
  result<std::optional<loaded_checkpoint>> load_latest(Tree& tree, const load_options& opt = {}) {
    CAIRN_TRY_ASSIGN(auto found, find_latest());
    if (!found) return std::optional<loaded_checkpoint>();
    CAIRN_TRY_ASSIGN(loaded_checkpoint l, load(tree, found->first, opt));
    l.found_by_scan = found->second;
    return std::optional<loaded_checkpoint>(std::move(l));
  }

  /// Loads checkpoint `name` (or the one tag `name` points at, "tags/<name>") into `tree`
  /// (collective).
  template <class Tree>
  result<loaded_checkpoint> load(Tree& tree, std::string_view name, const load_options& opt = {}) {
    return load_flattened([&] { return flatten(tree); }, name, opt);
  }

  /// The checkpoints under the root (`list_checkpoints` with this template and pointer). Not
  /// collective: call it on one rank of a large job.
  result<std::vector<checkpoint_entry>> list() const;

  /// The name template.
  const name_template& names() const noexcept;
  /// The options, as completed by the constructor.
  const checkpointer_options& options() const noexcept;
  /// The storage of checkpoint `name` (its objects under "`name`/").
  result<prefixed_storage> storage_of(const std::string& name) const;

 private:
  /// The caller's tree as its leaves: called where `save` and `load` would flatten it (after
  /// the collective steps that come first), so that a tree that cannot be visited fails there.
  using flatten_fn = std::function<leaf_list()>;

  /// The bodies of `try_save` and `load` (collective).
  result<saved_checkpoint> save_flattened(const flatten_fn& leaves,
                                          const checkpoint_counters& at,
                                          const std::vector<std::string>& tags);
  result<loaded_checkpoint> load_flattened(const flatten_fn& leaves,
                                           std::string_view name,
                                           const load_options& opt);

  /// What a checkpointer holds: its root, communicator, options, name template, plan cache,
  /// staging pool, async saver and the save in flight (cairn/manager/checkpointer-inl.hpp).
  struct state;
  std::unique_ptr<state> s_;

  checkpointer(std::shared_ptr<any_storage> owned, comm_ref comm, checkpointer_options opt);

  checkpointer(std::shared_ptr<any_storage> owned,
               storage_ref root,
               comm_ref comm,
               checkpointer_options opt);

  static name_template parse_or_throw(const checkpointer_options& opt);

  static std::shared_ptr<any_storage> open_shared(std::string_view uri);

  /// Collective: `decide()` runs on rank 0 alone (storage reads and writes only, no collective);
  /// every rank receives its bytes, or its error.
  template <class Decide>
  result<bytes> decided_on_root(comm_ref comm, Decide&& decide);

  /// Collective: the name of the checkpoint at `at`, the same on every rank with the same
  /// tags, or an error naming the ranks that differ (or whose name is not valid).
  result<std::string> agree_on_name(const checkpoint_counters& at,
                                    const std::vector<std::string>& tags);

  /// Collective, after `name` committed: rank 0 moves `latest` and the tags to it, then runs
  /// retention; every rank learns how that went. A pointer that could not be moved is an error
  /// (the checkpoint is committed, but `latest` still names an older one); failed deletions are
  /// reported in the result.
  result<committed_checkpoint> publish(const std::string& name,
                                       const std::vector<std::string>& tags,
                                       save_stats stats,
                                       comm_ref comm);

  result<committed_checkpoint> catch_and_publish(const std::string& name,
                                                 const std::vector<std::string>& tags);

  /// Rank 0, after `name` committed and `latest` names it: deletes the committed checkpoints
  /// of this template that no rule keeps, and the incomplete ones older than `name` (left by
  /// killed or failed saves). Never `name`, never one a pointer names, never an incomplete one
  /// newer than `name` (an async save in flight), never one whose name is not of the template.
  void retain(const std::string& name, committed_checkpoint& c);

  /// Rank 0: the newest committed checkpoint and whether it was found by listing.
  result<std::optional<std::pair<std::string, bool>>> resolve_latest();

  /// Rank 0: the format of checkpoint `name` under the root ("" when it is not committed).
  result<std::string> format_at(const std::string& name);

  /// Rank 0: checkpoint `name` (or the one tag `name` names) and its counters; errc::not_found
  /// when it is not committed.
  result<std::pair<std::string, checkpoint_counters>> resolve_name(std::string name);
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/manager/checkpointer-inl.hpp"
#endif
