// cairn/comm/threads.hpp: in-process thread ranks. N ranks run as N real threads of one
// process and exchange bytes through shared memory; for tests and simulations of multi-rank
// saves and loads without MPI.
//
// - `thread_group`: the state the N ranks share (one mutex, one condition variable, a
//   generation-counted reusable barrier, one payload slot per rank, and an abort state).
// - `thread_communicator`: a cheap handle (group pointer + rank) that models `communicator`.
// - `run_ranks(n, f)` / `run_ranks_collect(n, f)`: start n threads, call `f(comm)` on each,
//   join them all, rethrow the failure that started it all.
//
// Collectives, and what an MPI communicator does for the same call (the `communicator` concept
// is shaped so that one drops in unchanged):
// - `all_gather(data)`: every rank deposits a view of `data` in its slot; entry barrier; every
//   rank copies all slots in rank order; exit barrier (after which no rank reads another's
//   buffer, so the slots and the callers' buffers may be reused).
//   MPI: MPI_Allgather of the 64-bit sizes, then MPI_Allgatherv of the bytes into one buffer
//   that is split per rank (counts above INT_MAX go in chunks or through a derived datatype).
// - `broadcast(buf, root)`: root deposits a view of `buf`; entry barrier; the other ranks copy
//   it (resizing `buf`); exit barrier. MPI: MPI_Bcast of the 64-bit size from root, resize, then
//   MPI_Bcast of the bytes.
// - `gather(data, root)`: like all_gather, but only `root` copies the slots. MPI: MPI_Gather of
//   the sizes, then MPI_Gatherv.
// - `all_to_all(to)`: every rank deposits a view of its per-destination buffers; entry barrier;
//   every rank copies what each rank addressed to it; exit barrier. MPI: MPI_Alltoall of the
//   sizes, then MPI_Alltoallv.
// - `barrier()`: one barrier. MPI: MPI_Barrier.
// Transport failures become `cairn::exception` with errc::comm in both.
//
// Failure, instead of a hang: when a rank fails (its function throws, or a collective is
// misused), the group is aborted and every rank waiting in, or later entering, a collective
// throws `cairn::exception` (errc::comm, "rank 2 failed: <what>"). The same happens when a rank
// returns while others still wait in a collective it will never join, when ranks call
// different collectives (or broadcast from different roots) at the same step, and when a rank
// waits in a collective longer than the group's deadline for the others to arrive (the message
// names the ranks that did not arrive). An aborted group stays aborted.
#pragma once

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

class thread_communicator;

namespace detail {

// what() of the exception in `ep`, or "unknown exception".
CAIRN_INLINE std::string what_of(const std::exception_ptr& ep);

}  // namespace detail

/// The state shared by the N ranks of one in-process thread world.
///
/// Create one per world, then give rank i the handle `group.comm(i)` on its own thread (or let
/// `run_ranks` do all of it). Each rank must call collectives from one thread at a time, in the
/// same order as the other ranks. Not copyable or movable: handles point to it, and it must
/// outlive every handle and every thread that uses one.
class thread_group {
 public:
  /// A group of `size` ranks. A rank that waits longer than `deadline` in a collective for the
  /// others to arrive aborts the group, naming the ranks that did not arrive (every waiting rank
  /// throws errc::comm); zero waits forever. Throws `cairn::exception`
  /// (errc::invalid_argument) if size < 1 or the deadline is negative.
  explicit thread_group(int size, std::chrono::milliseconds deadline = default_collective_deadline);
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;

  /// The number of ranks.
  int size() const noexcept { return size_; }
  /// How long a rank waits in a collective for the others (zero: forever).
  std::chrono::milliseconds deadline() const noexcept { return deadline_; }

  /// The handle for `rank` (0 <= rank < size(); otherwise throws errc::invalid_argument).
  thread_communicator comm(int rank);

  /// Marks the group failed because of `rank` (or, with rank < 0, because of something outside
  /// any rank) and wakes every waiting rank; they, and every later collective, throw
  /// errc::comm with "rank <rank> failed: <what>". Only the first call has an effect.
  void abort(int rank, std::string_view what);

  /// Declares that `rank` will call no more collectives (its thread is done). Any collective
  /// that would wait for it fails with errc::comm instead of hanging. `run_ranks` calls it when
  /// a rank's function returns.
  void finish(int rank);

  /// True once the group has been aborted.
  bool aborted() const;

  /// The message every collective of an aborted group throws with; empty while not aborted.
  std::string abort_message() const;

  /// True when a collective on `rank` has thrown because the group was aborted: a failure of
  /// that rank after this point is a consequence, not a cause. `run_ranks` uses it to rethrow
  /// the cause.
  bool saw_abort(int rank) const;

  /// The group of `rank`'s next duplicate: the k-th call of each rank returns the same group of
  /// this size and deadline (made by the first rank to ask), owned by the handles that use it.
  /// Aborting this group aborts its live duplicates (not the other way round).
  /// `thread_communicator::duplicate` calls it.
  std::shared_ptr<thread_group> next_duplicate(int rank);

 private:
  friend class thread_communicator;

  enum class op_kind : std::uint8_t { barrier, all_gather, broadcast, gather, all_to_all };
  struct op {
    op_kind kind = op_kind::barrier;
    int root = -1;
    bool operator==(const op&) const = default;
  };

  static std::string describe(op o);

  void check_rank(int rank) const;

  void abort_locked(std::string message);

  [[noreturn]] void throw_aborted_locked(int rank);

  // Entry phase of a collective: deposits `payload` in the rank's slot and waits until every
  // rank has arrived. Throws errc::comm when the group is (or becomes) aborted before that, or
  // when the ranks disagree on the collective.
  void enter(int rank,
             op o,
             std::span<const std::byte> payload,
             const std::vector<bytes>* messages = nullptr);

  // Exit phase: waits until every rank has finished reading the slots. Not abortable: once the
  // entry phase completed, every rank is between the two phases and arrives here (failures
  // while copying are caught and carried past this point), so it cannot hang, and no rank's
  // buffer is released while another still reads it.
  void leave();

  // After the exit phase: a failure while copying aborts the group and is rethrown.
  void finish_collective(int rank, std::exception_ptr copy_error);

  std::span<const std::byte> slot(int rank) const { return slots_[static_cast<std::size_t>(rank)]; }
  // What `from` addressed to `to` in the current all_to_all.
  std::span<const std::byte> message(int from, int to) const {
    return (*messages_[static_cast<std::size_t>(from)])[static_cast<std::size_t>(to)];
  }

  const int size_;
  const std::chrono::milliseconds deadline_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;                // ranks waiting in the current phase
  std::uint64_t generation_ = 0;   // completed phases (entry and exit)
  std::uint64_t collectives_ = 0;  // completed entry phases, for messages
  op first_op_;                    // the collective the first arriver of this phase called
  int first_rank_ = -1;            // ... and its rank
  int finished_rank_ = -1;         // the first rank that declared it is done
  bool aborted_ = false;
  std::string abort_message_;
  std::vector<std::span<const std::byte>> slots_;    // read only between entry and exit
  std::vector<const std::vector<bytes>*> messages_;  // all_to_all: each rank's outgoing buffers
  std::vector<char> saw_abort_;
  std::vector<char> arrived_here_;  // which ranks have entered the current entry phase
  // Duplicates not yet taken by every rank (by their number), every live duplicate (to abort
  // them with this group), and how many duplicates each rank took.
  struct open_duplicate {
    std::shared_ptr<thread_group> group;
    int taken = 0;
  };
  std::vector<std::pair<std::size_t, open_duplicate>> open_duplicates_;
  std::vector<std::weak_ptr<thread_group>> duplicates_;
  std::vector<std::size_t> duplicates_taken_;
};

/// One rank's handle on a `thread_group`; models `communicator`. Cheap to copy (a pointer, an
/// int, and for a duplicate's handle the group it keeps alive). See the top of this header for the
/// collectives' protocol and their MPI mapping.
class thread_communicator {
 public:
  /// The handle of `rank` in `group` (0 <= rank < group.size()).
  thread_communicator(thread_group& group, int rank) : group_(&group), rank_(rank) {
    group.check_rank(rank);
  }

  /// This rank, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// The number of ranks in the group.
  int size() const noexcept { return group_->size(); }
  /// The group this handle belongs to.
  thread_group& group() const noexcept { return *group_; }

  /// Every rank's `data`, indexed by rank. Throws errc::comm if the group is aborted.
  std::vector<bytes> all_gather(std::span<const std::byte> data);

  /// Copies `buf` from `root` into `buf` on every other rank (resizing it). Throws errc::comm
  /// if the group is aborted, errc::invalid_argument (and aborts the group) if `root` is out
  /// of range.
  void broadcast(bytes& buf, int root);

  /// Every rank's `data` on `root`, indexed by rank; an empty vector on the other ranks.
  /// Throws errc::comm if the group is aborted, errc::invalid_argument (and aborts the group)
  /// if `root` is out of range.
  std::vector<bytes> gather(std::span<const std::byte> data, int root);

  /// `to[r]` goes to rank r; returns what every rank sent to this one, by sender. Throws
  /// errc::invalid_argument (and aborts the group) unless `to` has one buffer per rank.
  std::vector<bytes> all_to_all(const std::vector<bytes>& to);

  /// Returns once every rank has entered it. Throws errc::comm if the group is aborted.
  void barrier() { group_->enter(rank_, {thread_group::op_kind::barrier, -1}, {}); }
  /// This rank's handle on a new group of the same ranks (`thread_group::next_duplicate`),
  /// which it keeps alive: another thread of this rank may run collectives on it while this
  /// one is in use. Every rank calls it, in the same order as its other duplicates (it does not
  /// wait for them).
  std::unique_ptr<thread_communicator> duplicate() const {
    std::shared_ptr<thread_group> g = group_->next_duplicate(rank_);
    auto c = std::make_unique<thread_communicator>(*g, rank_);
    c->owned_ = std::move(g);
    return c;
  }

 private:
  // One collective that returns a buffer per rank: deposits `payload` (and `messages`), and
  // when `copy`, copies `source(r)` for every rank r between the entry and exit phases.
  template <class Source>
  std::vector<bytes> collect(thread_group::op o,
                             std::span<const std::byte> payload,
                             const std::vector<bytes>* messages,
                             bool copy,
                             Source source) {
    group_->enter(rank_, o, payload, messages);
    std::vector<bytes> out;
    std::exception_ptr copy_error;
    if (copy) {
      try {
        out.resize(static_cast<std::size_t>(size()));
        for (int r = 0; r < size(); ++r) {
          std::span<const std::byte> s = source(r);
          out[static_cast<std::size_t>(r)].assign(s.begin(), s.end());
        }
      } catch (...) {
        copy_error = std::current_exception();
      }
    }
    group_->leave();
    group_->finish_collective(rank_, copy_error);
    return out;
  }

  // Aborts the group and throws errc::invalid_argument when `root` is not a rank.
  void check_root(int root, const char* collective);

  thread_group* group_;
  int rank_;
  std::shared_ptr<thread_group> owned_;  // a duplicate's group, kept alive by its handles
};

inline thread_communicator thread_group::comm(int rank) { return thread_communicator(*this, rank); }

static_assert(scalable_communicator<thread_communicator>);
static_assert(duplicable_communicator<thread_communicator>);

namespace detail {

// What run_ranks calls on every rank: `f(comm)` with an lvalue `f`.
template <class F>
concept rank_function = std::invocable<F&, thread_communicator&>;

// What `f(comm)` returns, decayed (run_ranks_collect's element type).
template <class F>
using rank_result_t = std::decay_t<std::invoke_result_t<F&, thread_communicator&>>;

// The body of run_ranks, not a template: runs `call(ctx, comm)` on n threads of a group with
// `deadline`.
CAIRN_INLINE void run_ranks_erased(int n,
                                   std::chrono::milliseconds deadline,
                                   void (*call)(void*, thread_communicator&),
                                   void* ctx);

}  // namespace detail

/// Runs `f(comm)` on `n` threads, one per rank (comm is rank i's `thread_communicator&`), and
/// returns once all have finished. `f` is called concurrently from every thread.
///
/// If ranks throw, the group is aborted (others' collectives throw errc::comm instead of
/// hanging) and, after every thread has joined, the exception of the lowest rank that failed on
/// its own (not because of the abort) is rethrown here.
///
/// ```
/// cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
///   cairn::save(state_of(comm.rank()), disk, comm);
/// });
/// ```
template <detail::rank_function F>
void run_ranks(int n, std::chrono::milliseconds deadline, F&& f) {
  // Type-erase through a lambda holding a reference, so plain functions work as well as
  // callable objects (a function cannot be cast to void*).
  auto call = [&f](thread_communicator& c) { std::invoke(f, c); };
  using call_t = decltype(call);
  detail::run_ranks_erased(
      n, deadline, [](void* ctx, thread_communicator& c) { (*static_cast<call_t*>(ctx))(c); },
      &call);
}

/// `run_ranks` with the default collective deadline (`default_collective_deadline`).
template <detail::rank_function F>
void run_ranks(int n, F&& f) {
  run_ranks(n, default_collective_deadline, std::forward<F>(f));
}

/// Like `run_ranks`, and returns what `f` returned on each rank (decayed), indexed by rank.
///
/// `auto ranks = cairn::run_ranks_collect(3, [](auto& c) { return c.rank(); });  // {0, 1, 2}`
template <detail::rank_function F>
auto run_ranks_collect(int n, F&& f) {
  static_assert(!std::is_void_v<detail::rank_result_t<F>>,
                "run_ranks_collect needs a function that returns a value; use run_ranks");
  using R = detail::rank_result_t<F>;
  std::vector<std::optional<R>> slots(n > 0 ? static_cast<std::size_t>(n) : 0);
  run_ranks(n, [&](thread_communicator& c) {
    slots[static_cast<std::size_t>(c.rank())].emplace(std::invoke(f, c));
  });
  std::vector<R> out;
  out.reserve(slots.size());
  for (auto& s : slots) out.push_back(std::move(*s));
  return out;
}

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/comm/threads-inl.hpp"
#endif
