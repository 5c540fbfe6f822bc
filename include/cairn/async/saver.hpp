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
// tensors at once. The commit needs every rank, so it happens on the caller's thread, at the
// next collective cairn call: `handle.wait()`, `saver.finalize()`, or the next `save`. Until
// then the checkpoint is not committed (metadata.json is written last), and a background
// write's error is held for that call, where every rank sees it.
//
// Staged bytes are a private copy (host tensors too), so the caller's memory never aliases the
// checkpoint. The background thread takes checksums of the staged bytes before it writes
// anything and checks them again once the write has ended: bytes changed in the pool in
// between (a stray write, a buffer reused too early) fail the save on every rank with
// errc::corrupt naming the key, and nothing of it is committed. (A change in the moment
// between the end of the copy and those first checksums is not seen: taking them on the
// training thread would lengthen the stall.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/detail/config.hpp"
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
  /// Called when the saver is destroyed with a save that was never committed (no `finalize`,
  /// `wait` or later `save`): that save is dropped, not loadable, and the previous checkpoint
  /// stays the latest. The error (errc::incomplete_checkpoint) names the save and this rank, and
  /// the write's own error when it failed. The same line goes to stderr, set or not.
  std::function<void(const error&)> on_dropped;
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
};

class async_saver;

/// A save started by `async_saver::save`. `wait()` commits it (collective: every rank calls it,
/// or `finalize()`, or starts the next save) and returns its statistics or the error of any rank.
class save_handle {
 public:
  /// The statistics of the synchronous part.
  const async_save_stats& started() const noexcept { return started_; }
  /// Commits this save if it is still in flight and returns its result (collective).
  result<save_stats> wait();
  /// Whether this rank's background write of the save has ended (well or not), without
  /// blocking: `wait()` then only commits. True once the save is committed.
  bool written() const noexcept;

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
  /// Waits for the background write of a save that was never committed, and drops it: that
  /// save is not committed (the previous checkpoint, if any, stays the loadable one). The drop
  /// is reported, never silent: a line on stderr and `async_saver_options::on_dropped`.
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

  /// Commits the save in flight, if any (collective), and returns its result; with none in
  /// flight, the result of the last one committed.
  result<save_stats> finalize();

  /// Whether a save was started and not yet committed.
  bool in_flight() const noexcept;
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
                                  const save_options& requested);

  result<save_stats> wait_for(std::uint64_t seq);
  bool written_through(std::uint64_t seq) const noexcept;

  std::unique_ptr<state> s_;
};

inline result<save_stats> save_handle::wait() { return saver_->wait_for(seq_); }
inline bool save_handle::written() const noexcept { return saver_->written_through(seq_); }

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/async/saver-inl.hpp"
#endif
