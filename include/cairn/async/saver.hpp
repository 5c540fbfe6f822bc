// cairn/async/saver.hpp: save with training stalled only for the copy into a staging pool.
//
//   cairn::async_saver saver;                       // owns the staging pool; keep it for the run
//   for (int step = 0;; ++step) {
//     train_step();
//     if (step % 100 == 0) {
//       auto h = saver.save(state, disk, comm, opt);  // returns once the bytes are staged
//       if (!h) handle(h.err());                     // planning or staging failed (every rank)
//     }
//   }
//   saver.finalize().value();                        // commit the last save (collective)
//
// A save has three phases (see save.hpp): plan (collective), write (local), commit (collective).
// `async_saver::save` plans, copies every byte this rank writes into the staging pool (device
// memory through cudaMemcpyAsync, host memory with a few threads of memcpy) and starts the
// write on a background thread; it returns when the copy is done, so the caller may change its
// tensors at once. The commit needs every rank: the background thread runs it as soon as its
// write has ended, on a duplicate of the caller's communicator that the saver makes for each
// save (`comm_ref::duplicate`: thread ranks, one process, MPI initialized with
// MPI_THREAD_MULTIPLE), so the checkpoint is loadable as soon as every rank has written and
// the training thread does no commit work. `handle.done()` tells, without blocking, when that
// has happened. Without a duplicate (an MPI library at a lower thread level, a communicator
// of the user's without `duplicate()`), the commit happens on the caller's thread at the next
// collective cairn call: `handle.wait()`, `saver.finalize()`, or the next `save`. Either way
// the checkpoint is not committed before every rank has written (metadata.json is written
// last), and an error of any rank is returned by `wait()`, `finalize()` or the next `save` on
// every rank.
//
// Staged bytes are a private copy (host tensors too), so the caller's memory never aliases the
// checkpoint. The background thread takes checksums of the staged bytes before it writes
// anything and checks them again once the write has ended: bytes changed in the pool in
// between (a stray write, a buffer reused too early) fail the save on every rank with
// errc::corrupt naming the key, and nothing of it is committed. (A change in the moment
// between the end of the copy and those first checksums is not seen: taking them on the
// training thread would lengthen the stall.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/save.hpp"

namespace cairn {

/// What `async_saver::save` does when the previous save has not been committed yet.
enum class on_save_in_flight {
  wait,  ///< finalize (commit) the previous save first, then start the new one
  fail,  ///< fail with errc::invalid_argument on every rank; the previous save goes on
};

/// Options of an `async_saver`.
struct async_saver_options {
  /// Threads that copy host memory into the staging pool (the caller's thread is one of them).
  int staging_threads = 2;
  /// What a save does while another is in flight.
  on_save_in_flight in_flight = on_save_in_flight::wait;
  /// Background writers on this node that may write at the same time (0: no limit). With
  /// several ranks per node, this keeps them from fighting over the disk or the network; ranks
  /// wait for a slot (an flock on a file in `writer_lock_dir`) before writing.
  int max_writers_per_node = 0;
  /// Where the writer slots' lock files live (node-local; the same for every rank of a node).
  std::string writer_lock_dir = "/tmp";
  /// Staging memory: the pool's options and the CUDA runtime (null: the default one; without a
  /// usable device, plain aligned host memory).
  cuda::staging_pool_options pool = {};
  const cuda::runtime_api* runtime = nullptr;
  /// Called when the saver is destroyed with a save whose result nobody collected (no
  /// `finalize`, `wait` or later `save`) and that is not committed: it failed in the
  /// background, or nothing commits in the background. That save is not loadable, and the
  /// previous checkpoint stays the latest. The error (errc::incomplete_checkpoint) names the
  /// save and this rank, and the save's own error when it failed. The same line goes to
  /// stderr, set or not.
  std::function<void(const error&)> on_dropped;
  /// Host memory this rank may stage for one save, in bytes (0: no limit). A save whose items
  /// would stage more is written in buckets instead: before `save` returns, host tensors are
  /// written in place and device tensors through a staging window of this size, piece by
  /// piece (as a synchronous save is), so training waits for the write, and only the commit
  /// runs in the background. The saver says so (`async_save_stats::bucketed`, and one line on
  /// stderr the first time). A budget smaller than one checksum block (`block_size`), or a
  /// strategy that does not read device items in pieces with device tensors to save, fails on
  /// every rank with errc::resource naming the sizes, before anything is written (the previous
  /// checkpoint stays).
  std::size_t host_budget = 0;
  /// A staging pool the caller owns (null: the saver allocates its own from `pool` and
  /// `runtime`). Give the same pool to synchronous `save` and `load` (`save_options::staging`,
  /// `load_options::staging`) and pinned memory is allocated once for all of them. The pool is
  /// busy while an async save is in flight: a synchronous call given it then fails
  /// (errc::invalid_argument) instead of overwriting staged bytes.
  cuda::staging_pool* staging = nullptr;
};

/// Timing of the synchronous part of an async save.
struct async_save_stats {
  double plan_ms = 0;   ///< planning (collective)
  double stage_ms = 0;  ///< copying into the staging pool
  double stall_ms = 0;  ///< the whole call, what training waited for
  std::uint64_t staged_bytes = 0;
  bool plan_reused = false;  ///< the plan cache was hit
  /// This rank's part did not fit `async_saver_options::host_budget`: it was written in
  /// buckets through a staging window of the budget before `save` returned (`stage_ms` is that
  /// write, and nothing was staged); only the commit ran in the background.
  bool bucketed = false;
};

class async_saver;

namespace detail {
/// What runs once a save has committed, on the thread that committed it, with the
/// communicator it committed on (the checkpointer moves its pointers and applies retention).
using after_commit_fn = std::function<void(const save_stats&, comm_ref)>;
}  // namespace detail

/// A save started by `async_saver::save`. `wait()` returns its statistics or the error of any
/// rank, committing it first when the background thread could not (collective: every rank
/// calls it, or `finalize()`, or starts the next save).
class save_handle {
 public:
  /// The statistics of the synchronous part.
  const async_save_stats& started() const noexcept { return started_; }
  /// Waits for this save (committing it when the background thread does not) and returns its
  /// result (collective).
  result<save_stats> wait();
  /// Whether this rank's background write of the save has ended (well or not), without
  /// blocking. True once the save is done.
  bool written() const noexcept;
  /// Whether the save's outcome is settled on this rank, without blocking: committed (loadable)
  /// or failed, by the background thread or by `wait()`/`finalize()`. `wait()` then returns at
  /// once. Stays false until `wait()` when the saver commits on the caller's thread
  /// (`async_saver::commits_in_background()` is false).
  bool done() const noexcept;

 private:
  friend class async_saver;
  save_handle(async_saver* s, std::uint64_t seq, async_save_stats st)
      : saver_(s), seq_(seq), started_(st) {}
  async_saver* saver_;
  std::uint64_t seq_;
  async_save_stats started_;
};

/// Saves asynchronously through a staging pool that it allocates once (sized from the first
/// save's plan, pre-touched) and reuses for every later save: after the first save, a save of
/// the same state allocates no staging memory. One saver per rank; keep it for the whole run.
/// The storage and communicator given to `save` must stay alive until that save is committed.
class async_saver {
 public:
  /// A saver staging into `opt.staging`, or into a pool of its own.
  explicit async_saver(async_saver_options opt = {});
  async_saver(const async_saver&) = delete;
  async_saver& operator=(const async_saver&) = delete;
  /// Waits for the save in flight. Committed in the background, it stays committed. One that
  /// could not commit (it failed, or nothing commits in the background and no `finalize` came)
  /// is not loadable, the previous checkpoint stays the latest, and that is reported, never
  /// silently: a line on stderr and `async_saver_options::on_dropped`.
  ~async_saver();

  /// Plans the save (collective), stages this rank's bytes, starts writing them in the
  /// background and returns. The tree's memory may change as soon as it returns. A save still
  /// in flight is committed first (or, with on_save_in_flight::fail, this call fails).
  template <class Tree>
  result<save_handle> save(const Tree& tree,
                           storage_ref st,
                           comm_ref comm,
                           const save_options& opt = {}) {
    try {
      leaf_list leaves = flatten(const_cast<Tree&>(tree));
      return save_leaves(leaves, st, comm, opt);
    } catch (...) {
      return detail::current_exception_error("starting an async save").with_rank(comm.rank());
    }
  }

  /// Waits for the save in flight, if any, commits it when the background thread did not
  /// (collective), and returns its result; with none in flight, the result of the last one.
  result<save_stats> finalize();

  /// Whether a save was started and its result not yet collected (by `finalize`, `wait` or
  /// the next `save`).
  bool in_flight() const noexcept;
  /// Whether the last save started commits from the background thread (its communicator made
  /// a duplicate for it), rather than at the next collective call.
  bool commits_in_background() const noexcept;
  /// The staging pool (its capacity and allocation count show the reuse).
  const cuda::staging_pool& pool() const noexcept;
  /// Whether staging copies device memory through CUDA (a usable device).
  bool device_enabled() const noexcept;

 private:
  friend class save_handle;
  friend class checkpointer;  // starts saves of trees it has visited (save_leaves)
  /// Everything a saver holds between calls: its pool, stager, worker thread and the save in
  /// flight (cairn/async/saver-inl.hpp).
  struct state;

  result<save_handle> save_leaves(const leaf_list& leaves,
                                  storage_ref st,
                                  comm_ref comm,
                                  const save_options& requested,
                                  detail::after_commit_fn after_commit = {});

  /// The background write of the staged save in flight: seal the snapshot, write, verify
  /// (failures land in the flight's `written`).
  void write_flight();
  /// For a save over `host_budget` (`needed` bytes to stage): marks its device items and opens
  /// a staging window of the budget over the pool (null without device items), or says why it
  /// cannot be written in buckets (errc::resource).
  result<std::unique_ptr<cuda::staging_window>> open_bucket_window(planned_save& plan,
                                                                   const save_options& opt,
                                                                   std::size_t needed);
  result<save_stats> wait_for(std::uint64_t seq);
  bool written_through(std::uint64_t seq) const noexcept;
  bool done_through(std::uint64_t seq) const noexcept;

  std::unique_ptr<state> s_;
};

inline result<save_stats> save_handle::wait() { return saver_->wait_for(seq_); }
inline bool save_handle::written() const noexcept { return saver_->written_through(seq_); }
inline bool save_handle::done() const noexcept { return saver_->done_through(seq_); }

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/async/saver-inl.hpp"
#endif
