// cairn/async/saver-inl.hpp: the bodies of cairn/async/saver.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/async/saver.hpp"
#include "cairn/async/snapshot.hpp"
#include "cairn/comm/agree.hpp"
#include "cairn/pipeline/save.hpp"
#include "cairn/pipeline/stage.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/writer_slots.hpp"

namespace cairn {

struct async_saver::state {
  struct flight {
    std::uint64_t seq;
    planned_save plan;
    written_save written;
    std::unique_ptr<detail::recording_storage> st;  ///< the caller's storage, recording
    comm_ref comm;
    save_options opt;
    /// Where the background thread commits: a duplicate of `comm` made for this save (it
    /// lives as long as the flight); null: the commit waits for the next collective call on the
    /// caller's thread.
    std::shared_ptr<comm_ref> commit_comm;
    /// Runs after a successful commit, on the thread that committed, with its communicator.
    detail::after_commit_fn after_commit;
    /// The result of a background commit (set by the worker before `done_seq_`).
    std::optional<result<save_stats>> outcome;
  };

  explicit state(async_saver_options opt)
      : opt_(std::move(opt)),
        own_pool_(opt_.staging
                      ? std::nullopt
                      : std::optional<cuda::staging_pool>(std::in_place, opt_.pool, opt_.runtime)),
        pool_(opt_.staging ? opt_.staging : &*own_pool_),
        stager_(*pool_,
                cuda::stager_options{.threads = opt_.staging_threads, .runtime = opt_.runtime}) {}

  async_saver_options opt_;
  std::optional<cuda::staging_pool> own_pool_;
  cuda::staging_pool* pool_;
  cuda::stager stager_;
  buffer_pool buffers_;
  std::optional<flight> flight_;
  std::thread worker_;
  std::optional<result<save_stats>> last_;
  std::uint64_t seq_ = 0, committed_seq_ = 0;
  /// The last save whose background write ended (saves are written in order).
  std::atomic<std::uint64_t> written_seq_{0};
  /// The last save whose result is known on this rank (committed in the background or by
  /// `finalize`, or failed).
  std::atomic<std::uint64_t> done_seq_{0};
  /// Whether the last save started commits from the background thread.
  bool background_commit_ = false;
  planned_save spare_plan_;
  std::vector<cuda::stage_item> stage_items_;
  std::vector<std::size_t> stage_index_;
  /// Checksums of the staged bytes of the save in flight (taken and checked by the worker).
  detail::staged_snapshot snapshot_;
  std::vector<detail::staged_span> staged_spans_;
  /// Whether a bucketed save was reported on stderr (once per saver).
  bool said_bucketed_ = false;
};

CAIRN_INLINE async_saver::async_saver(async_saver_options opt)
    : s_(std::make_unique<state>(std::move(opt))) {}

namespace detail {

/// Commits a save whose background write has ended, on `comm`, then runs its after-commit step.
CAIRN_INLINE result<save_stats> commit_flight(planned_save& plan,
                                              written_save& written,
                                              recording_storage& st,
                                              comm_ref comm,
                                              const save_options& opt,
                                              const after_commit_fn& after) {
  try {
    CAIRN_TRY_ASSIGN(save_stats stats, commit_phase(plan, written, st, comm, opt));
    stats.files = st.names();
    if (after) after(stats, comm);
    return stats;
  } catch (...) {
    return current_exception_error("committing an async save").with_rank(comm.rank());
  }
}

}  // namespace detail

namespace detail {

/// The staging-pool bytes `items` take (with alignment), as the stager will acquire them.
CAIRN_INLINE std::size_t staged_bytes(std::span<const cuda::stage_item> items) {
  std::vector<std::size_t> sizes;
  sizes.reserve(items.size());
  for (const auto& it : items) sizes.push_back(it.bytes);
  return cuda::staging_pool::bytes_for(sizes);
}

}  // namespace detail

CAIRN_INLINE async_saver::~async_saver() {
  if (s_->worker_.joinable()) s_->worker_.join();
  if (!s_->flight_) return;
  const state::flight& f = *s_->flight_;
  if (f.outcome && *f.outcome) return;  // committed in the background: nothing was lost
  std::string what;
  if (f.outcome) {
    what = "async_saver destroyed after save " + std::to_string(f.seq) +
           " failed in the background (no finalize() or wait() collected it): it is not "
           "loadable, and the previous checkpoint stays the latest; " +
           f.outcome->err().describe();
  } else {
    what = "async_saver destroyed with save " + std::to_string(f.seq) +
           " not committed (no finalize(), wait() or later save(), and no duplicate "
           "communicator to commit it in the background): it was dropped, is not loadable, "
           "and the previous checkpoint stays the latest";
    if (f.written.failure) what += "; its write had failed: " + f.written.failure->describe();
  }
  const error dropped = make_error(errc::incomplete_checkpoint, what).with_rank(f.plan.rank);
  std::fprintf(stderr, "cairn: %s\n", dropped.describe().c_str());
  if (s_->opt_.on_dropped) {
    try {
      s_->opt_.on_dropped(dropped);
    } catch (...) {  // a destructor must not throw; the line above already reported it
    }
  }
}

CAIRN_INLINE result<save_stats> async_saver::finalize() {
  if (!s_->flight_) {
    if (s_->last_) return *s_->last_;
    return make_error(errc::invalid_argument, "async_saver: no save was started");
  }
  state::flight& f = *s_->flight_;
  if (s_->worker_.joinable()) s_->worker_.join();
  result<save_stats> r =
      f.outcome ? std::move(*f.outcome)
                : detail::commit_flight(f.plan, f.written, *f.st, f.comm, f.opt, f.after_commit);
  s_->pool_->reset();
  s_->committed_seq_ = f.seq;
  s_->done_seq_.store(f.seq, std::memory_order_release);
  s_->spare_plan_ = std::move(f.plan);
  s_->flight_.reset();
  s_->last_ = r;
  return r;
}

CAIRN_INLINE result<save_handle> async_saver::save_leaves(const leaf_list& leaves,
                                                          storage_ref st,
                                                          comm_ref comm,
                                                          const save_options& requested,
                                                          detail::after_commit_fn after_commit) {
  const save_options opt = detail::effective_options(requested);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  const auto t0 = clock::now();
  if (s_->flight_) {
    if (s_->opt_.in_flight == on_save_in_flight::fail) {
      // Every rank has a save in flight (they started it together), so every rank fails here.
      return make_error(errc::invalid_argument,
                        "async_saver: a save is still in flight (finalize() it first, "
                        "or use on_save_in_flight::wait)")
          .with_rank(comm.rank());
    }
    // A failure of the previous save is that save's: report it here, where every rank sees it.
    if (auto prev = finalize(); !prev) return std::move(prev).err();
  }
  // The communicator the background thread commits on (collective): one per save, so that
  // it never outlives, or mixes with, the communicator the save was given.
  std::shared_ptr<comm_ref> commit_comm = comm.duplicate();
  s_->background_commit_ = commit_comm != nullptr;
  // Reuse the last plan's storage (its vectors keep their capacity).
  planned_save plan = std::move(s_->spare_plan_);
  auto recorded = std::make_unique<detail::recording_storage>(st);
  CAIRN_TRY(detail::plan_phase(leaves, *recorded, comm, opt, plan));
  const auto t1 = clock::now();

  // Stage every tensor item (objects and common values are owned copies already).
  std::vector<cuda::stage_item>& items = s_->stage_items_;
  std::vector<std::size_t>& which = s_->stage_index_;
  items.clear();
  which.clear();
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    const write_item& it = plan.items[i];
    if (it.is_object || it.nbytes == 0) continue;
    items.push_back(cuda::stage_item{it.src, static_cast<std::size_t>(it.nbytes), it.key});
    which.push_back(i);
  }
  std::optional<error> stage_failure;
  s_->pool_->reset();
  const std::size_t needed = s_->opt_.host_budget > 0 ? detail::staged_bytes(items) : 0;
  // More than the budget: written in buckets through a window of the budget, before returning.
  const bool bucketed = needed > s_->opt_.host_budget;
  std::unique_ptr<cuda::staging_window> window;
  if (bucketed) {
    auto w = open_bucket_window(plan, opt, needed);
    if (w)
      window = std::move(*w);
    else
      stage_failure = std::move(w).err();
  } else if (auto staged = s_->stager_.stage(items); !staged) {
    stage_failure = std::move(staged).err();
  } else {
    for (std::size_t k = 0; k < which.size(); ++k) plan.items[which[k]].src = (*staged)[k].data();
    if (auto w = s_->stager_.wait(); !w) stage_failure = std::move(w).err();
  }
  // Staging is local; a failure on one rank must stop every rank before anything is written.
  if (stage_failure) stage_failure = std::move(*stage_failure).with_rank(comm.rank());
  if (auto f = agree(comm, stage_failure).first_failure()) {
    window.reset();
    s_->pool_->reset();
    return std::move(*f);
  }
  written_save written;
  if (bucketed) {
    if (!s_->said_bucketed_) {
      s_->said_bucketed_ = true;
      std::fprintf(stderr,
                   "cairn: async_saver: rank %d would stage %zu bytes, more than its host_budget "
                   "of %zu: such saves are written in buckets before save() returns (training "
                   "waits for the write; the commit stays in the background)\n",
                   comm.rank(), needed, s_->opt_.host_budget);
    }
    writer_slot slot =
        writer_slots(s_->opt_.max_writers_per_node, s_->opt_.writer_lock_dir).acquire();
    plan.window = window.get();
    written = detail::write_phase(plan, *recorded, opt, &s_->buffers_);
    plan.window = nullptr;
    window.reset();
    s_->pool_->reset();
  }
  const auto t2 = clock::now();
  async_save_stats started;
  started.plan_ms = ms(t0, t1);
  started.stage_ms = ms(t1, t2);
  started.staged_bytes = 0;
  if (!bucketed)
    for (const auto& it : items) started.staged_bytes += it.bytes;
  started.plan_reused = plan.stats.plan_reused;
  started.bucketed = bucketed;

  const std::uint64_t seq = ++s_->seq_;
  s_->flight_.emplace(state::flight{seq, std::move(plan), std::move(written), std::move(recorded),
                                    comm, opt, std::move(commit_comm), std::move(after_commit),
                                    std::nullopt});
  state::flight* f = &*s_->flight_;
  std::vector<detail::staged_span>& spans = s_->staged_spans_;
  spans.clear();
  for (std::size_t i : which) {
    const write_item& it = f->plan.items[i];
    spans.push_back({it.src, static_cast<std::size_t>(it.nbytes), it.key});
  }
  // A bucketed save was written before returning; only its commit is left to the worker.
  if (bucketed) s_->written_seq_.store(seq, std::memory_order_release);
  s_->worker_ = std::thread([this, f, bucketed] {
    if (!bucketed) {
      write_flight();
      s_->written_seq_.store(f->seq, std::memory_order_release);
    }
    // Commit (and publish) as soon as every rank has written, not at the next call.
    if (f->commit_comm) {
      f->outcome = detail::commit_flight(f->plan, f->written, *f->st, *f->commit_comm, f->opt,
                                         f->after_commit);
      s_->done_seq_.store(f->seq, std::memory_order_release);
    }
  });
  started.stall_ms = ms(t0, clock::now());
  return save_handle(this, seq, started);
}

CAIRN_INLINE void async_saver::write_flight() {
  state::flight& f = *s_->flight_;
  try {
    // The staged bytes' checksums, before anything is written; checked again once the write
    // has ended, so that what was persisted is what was staged.
    const int threads = std::max(1, s_->opt_.staging_threads);
    s_->snapshot_.seal(s_->staged_spans_, threads);
    writer_slot slot =
        writer_slots(s_->opt_.max_writers_per_node, s_->opt_.writer_lock_dir).acquire();
    f.written = detail::write_phase(f.plan, *f.st, f.opt, &s_->buffers_);
    if (!f.written.failure) {
      if (auto v = s_->snapshot_.verify(threads); !v) {
        f.written.failure = std::move(v).err().with_rank(f.plan.rank);
        detail::strategy_of(f.opt).abandon(f.plan, f.written, *f.st);
      }
    }
  } catch (...) {
    f.written.failure =
        detail::current_exception_error("writing an async save").with_rank(f.plan.rank);
  }
}

CAIRN_INLINE result<std::unique_ptr<cuda::staging_window>> async_saver::open_bucket_window(
    planned_save& plan, const save_options& opt, std::size_t needed) {
  const std::size_t budget = s_->opt_.host_budget;
  auto refuse = [&](const std::string& why) {
    return make_error(errc::resource,
                      "async_saver: this rank would stage " + std::to_string(needed) +
                          " bytes, more than its host_budget of " + std::to_string(budget) +
                          " (async_saver_options::host_budget), and " + why +
                          "; nothing was staged or written. Raise the budget, save fewer bytes "
                          "per rank (more ranks, a distributed optimizer), or save synchronously");
  };
  if (budget < opt.block_size)
    return refuse("the budget cannot hold one checksum block (block_size " +
                  std::to_string(opt.block_size) + ") to write it in buckets");
  bool device = false;
  for (write_item& it : plan.items) {
    it.on_device =
        !it.is_object && it.nbytes > 0 && s_->stager_.classify(it.src) == cuda::memory_kind::device;
    device = device || it.on_device;
  }
  if (!device) return std::unique_ptr<cuda::staging_window>();
  if (!detail::strategy_of(opt).features(opt).reads_device_items)
    return refuse("the " + std::string(detail::strategy_of(opt).name()) +
                  " strategy does not read device tensors in pieces to write them in buckets");
  const detail::window_shape shape = detail::shape_window(budget, opt.block_size, opt.io_threads);
  return cuda::staging_window::open(*s_->pool_, *s_->stager_.runtime(), shape.piece_bytes,
                                    shape.slots);
}

CAIRN_INLINE result<save_stats> async_saver::wait_for(std::uint64_t seq) {
  if (s_->flight_ && s_->flight_->seq == seq) return finalize();
  if (seq <= s_->committed_seq_ && s_->last_ && seq == s_->committed_seq_) return *s_->last_;
  return make_error(errc::invalid_argument,
                    "save_handle: this save was committed by a later call; its result was "
                    "returned there");
}

CAIRN_INLINE bool async_saver::written_through(std::uint64_t seq) const noexcept {
  return s_->written_seq_.load(std::memory_order_acquire) >= seq;
}

CAIRN_INLINE bool async_saver::done_through(std::uint64_t seq) const noexcept {
  return s_->done_seq_.load(std::memory_order_acquire) >= seq;
}

CAIRN_INLINE bool async_saver::commits_in_background() const noexcept {
  return s_->background_commit_;
}

CAIRN_INLINE bool async_saver::in_flight() const noexcept { return s_->flight_.has_value(); }

CAIRN_INLINE const cuda::staging_pool& async_saver::pool() const noexcept { return *s_->pool_; }

CAIRN_INLINE bool async_saver::device_enabled() const noexcept {
  return s_->stager_.device_enabled();
}

}  // namespace cairn
