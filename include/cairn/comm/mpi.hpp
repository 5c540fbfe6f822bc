// cairn/comm/mpi.hpp: a communicator over MPI (Open MPI on Debian), for real multi-process
// and multi-node runs. Part of the optional CMake target cairn::mpi.
#pragma once

// cairn uses the C API only; skip the deprecated C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#  define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#  define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"

namespace cairn {

namespace detail {
inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw exception(make_error(errc::comm, std::string(what) + " failed: " + std::string(msg, len)));
}
}  // namespace detail

/// A communicator over an MPI communicator. It duplicates the communicator it is given, so
/// cairn's messages never mix with the trainer's, and makes MPI errors return (they become
/// `cairn::exception` with errc::comm) instead of aborting. Construction and destruction are
/// collective over the given communicator.
///
/// Every collective is non-blocking underneath (MPI_Iallgather, MPI_Ibcast, ...) and is waited
/// for with MPI_Test until `deadline()`: a rank that waits longer throws errc::comm naming the
/// ranks that did not arrive and the collective ("rank(s) 2 did not arrive at all_gather
/// (collective #14) within 600000 ms"). To name them, a rank that gives up tells every other
/// rank on a second duplicate; ranks waiting in any collective answer at once (and fail the
/// same way), so the ones that never answer within a short grace (at most 2 s) are the
/// stragglers. A straggler that comes later finds the reports and fails as soon as it enters a
/// collective. After a timeout the communicator is unusable (every call throws); the buffers
/// of the collective left pending stay allocated (and the MPI communicators unfreed) for good,
/// since MPI may still use them. A deadline of zero waits forever (blocking MPI calls).
///
///     cairn::mpi_environment env(argc, argv);   // or MPI_Init_thread in the trainer
///     cairn::mpi_communicator comm(MPI_COMM_WORLD);
///     cairn::save(state, disk, comm);
class mpi_communicator {
 public:
  /// Duplicates `parent` (collective). Throws errc::invalid_argument for a negative deadline.
  explicit mpi_communicator(MPI_Comm parent = MPI_COMM_WORLD,
                            std::chrono::milliseconds deadline = default_collective_deadline)
      : deadline_(deadline) {
    if (deadline.count() < 0)
      throw exception(make_error(
          errc::invalid_argument,
          "a negative collective deadline: " + std::to_string(deadline.count()) + " ms"));
    detail::mpi_check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    detail::mpi_check(MPI_Comm_dup(comm_, &watch_), "MPI_Comm_dup");
    adopt();
  }
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (timed_out_.empty()) {
      if (watch_ != MPI_COMM_NULL) MPI_Comm_free(&watch_);
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      return;
    }
    // After a timeout, pending requests may still use the communicators and these buffers:
    // they are left allocated on purpose.
    for (auto& b : timed_out_) (void)b.release();
    (void)new std::vector<std::uint64_t>(std::move(report_buf_));
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The duplicated MPI communicator cairn uses.
  MPI_Comm native() const noexcept { return comm_; }
  /// How long a collective waits for the other ranks (zero: forever).
  std::chrono::milliseconds deadline() const noexcept { return deadline_; }

  /// Another duplicate of this communicator (MPI_Comm_dup, collective), with the same deadline,
  /// for a thread of this rank other than the one using this one: only when MPI was
  /// initialized with MPI_THREAD_MULTIPLE (`mpi_environment` asks for it), else null. Every
  /// rank of a job gets the same thread level, so every rank makes the same choice.
  /// MPI_Comm_idup, waited for until the deadline like any collective.
  std::unique_ptr<mpi_communicator> duplicate() {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE) return nullptr;
    start("duplicate");
    auto& b = buffers();
    for (MPI_Comm* c : {&b.comms[0], &b.comms[1]})
      wait_for("MPI_Comm_idup", [&](MPI_Request* r) { return MPI_Comm_idup(comm_, c, r); });
    finish();
    return std::unique_ptr<mpi_communicator>(
        new mpi_communicator(b.comms[0], b.comms[1], deadline_));
  }

  /// Every rank's buffer, by rank: MPI_Iallgather of the sizes, then MPI_Iallgatherv of the
  /// bytes (or per-rank broadcasts when the total exceeds MPI's int counts).
  std::vector<bytes> all_gather(std::span<const std::byte> in) {
    start("all_gather");
    auto& b = buffers();
    b.mine = {in.size()};
    b.sizes.assign(static_cast<std::size_t>(size_), 0);
    wait_for("MPI_Iallgather", [&](MPI_Request* r) {
      return MPI_Iallgather(b.mine.data(), 1, MPI_UINT64_T, b.sizes.data(), 1, MPI_UINT64_T, comm_,
                            r);
    });
    std::uint64_t total = 0;
    for (auto s : b.sizes) total += s;
    if (total <= static_cast<std::uint64_t>(INT_MAX)) {
      const layout l = layout_of(b.sizes);
      b.send.assign(in.begin(), in.end());
      b.recv.assign(total, std::byte{0});
      wait_for("MPI_Iallgatherv", [&](MPI_Request* r) {
        return MPI_Iallgatherv(b.send.data(), static_cast<int>(b.send.size()), MPI_BYTE,
                               b.recv.data(), l.counts.data(), l.displs.data(), MPI_BYTE, comm_, r);
      });
      return finish(split(b.recv, l));
    }
    b.parts.assign(static_cast<std::size_t>(size_), {});
    for (int r = 0; r < size_; ++r) {
      auto& part = b.parts[static_cast<std::size_t>(r)];
      part = r == rank_ ? bytes(in.begin(), in.end()) : bytes(b.sizes[static_cast<std::size_t>(r)]);
      broadcast_bytes(part, r);
    }
    return finish(std::move(b.parts));
  }

  /// Copies `buf` from `root` to every rank (MPI_Ibcast of the size, then of the bytes).
  void broadcast(bytes& buf, int root) {
    check_root(root, "broadcast");
    start("broadcast");
    auto& b = buffers();
    b.mine = {buf.size()};
    wait_for("MPI_Ibcast", [&](MPI_Request* r) {
      return MPI_Ibcast(b.mine.data(), 1, MPI_UINT64_T, root, comm_, r);
    });
    if (rank_ == root) {
      b.recv = buf;
    } else {
      b.recv.assign(b.mine[0], std::byte{0});
    }
    broadcast_bytes(b.recv, root);
    buf = std::move(b.recv);
    finish();
  }

  /// Every rank's buffer on `root`, by rank (an empty vector elsewhere): MPI_Igather of the
  /// sizes, then MPI_Igatherv (or point-to-point messages when the total exceeds MPI's int
  /// counts).
  std::vector<bytes> gather(std::span<const std::byte> in, int root) {
    check_root(root, "gather");
    start("gather");
    auto& b = buffers();
    b.mine = {in.size()};
    b.sizes.assign(rank_ == root ? static_cast<std::size_t>(size_) : 0, 0);
    wait_for("MPI_Igather", [&](MPI_Request* r) {
      return MPI_Igather(b.mine.data(), 1, MPI_UINT64_T, b.sizes.data(), 1, MPI_UINT64_T, root,
                         comm_, r);
    });
    std::uint64_t total = 0;
    for (auto s : b.sizes) total += s;
    b.flag = {static_cast<std::uint64_t>(total <= static_cast<std::uint64_t>(INT_MAX))};
    wait_for("MPI_Ibcast", [&](MPI_Request* r) {
      return MPI_Ibcast(b.flag.data(), 1, MPI_UINT64_T, root, comm_, r);
    });
    if (b.flag[0]) {
      const layout l = layout_of(b.sizes);
      b.send.assign(in.begin(), in.end());
      b.recv.assign(total, std::byte{0});
      wait_for("MPI_Igatherv", [&](MPI_Request* r) {
        return MPI_Igatherv(b.send.data(), static_cast<int>(b.send.size()), MPI_BYTE, b.recv.data(),
                            l.counts.data(), l.displs.data(), MPI_BYTE, root, comm_, r);
      });
      return finish(rank_ == root ? split(b.recv, l) : std::vector<bytes>());
    }
    if (rank_ != root) {
      b.send.assign(in.begin(), in.end());
      exchange_bytes(b.send, root, {}, MPI_PROC_NULL);
      return finish(std::vector<bytes>());
    }
    b.parts.assign(static_cast<std::size_t>(size_), {});
    for (int r = 0; r < size_; ++r) {
      auto& part = b.parts[static_cast<std::size_t>(r)];
      if (r == root) {
        part.assign(in.begin(), in.end());
        continue;
      }
      part.resize(b.sizes[static_cast<std::size_t>(r)]);
      exchange_bytes({}, MPI_PROC_NULL, part, r);
    }
    return finish(std::move(b.parts));
  }

  /// What every rank sent to this one, by sender; `to[r]` goes to rank r: MPI_Ialltoall of the
  /// sizes, then MPI_Ialltoallv (or pairwise exchanges when a count exceeds MPI's ints).
  std::vector<bytes> all_to_all(const std::vector<bytes>& to) {
    if (to.size() != static_cast<std::size_t>(size_))
      throw exception(make_error(errc::invalid_argument, "all_to_all needs one buffer per rank (" +
                                                             std::to_string(size_) + "), got " +
                                                             std::to_string(to.size())));
    start("all_to_all");
    auto& b = buffers();
    const auto n = static_cast<std::size_t>(size_);
    b.mine.assign(n, 0);
    b.sizes.assign(n, 0);
    std::uint64_t send_total = 0, recv_total = 0;
    for (std::size_t r = 0; r < n; ++r) send_total += b.mine[r] = to[r].size();
    wait_for("MPI_Ialltoall", [&](MPI_Request* r) {
      return MPI_Ialltoall(b.mine.data(), 1, MPI_UINT64_T, b.sizes.data(), 1, MPI_UINT64_T, comm_,
                           r);
    });
    for (auto s : b.sizes) recv_total += s;
    b.flag = {static_cast<std::uint64_t>(std::max(send_total, recv_total) <=
                                         static_cast<std::uint64_t>(INT_MAX)),
              0};
    wait_for("MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(b.flag.data(), b.flag.data() + 1, 1, MPI_UINT64_T, MPI_MIN, comm_, r);
    });
    if (!b.flag[1]) {
      b.parts.assign(n, {});
      b.parts[static_cast<std::size_t>(rank_)] = to[static_cast<std::size_t>(rank_)];
      for (int k = 1; k < size_; ++k) {
        int dst = (rank_ + k) % size_, src = (rank_ - k + size_) % size_;
        // Sent from a copy: a timed-out send may still read it after the caller's `to` is gone.
        const bytes& message = to[static_cast<std::size_t>(dst)];
        b.send.assign(message.begin(), message.end());
        b.parts[static_cast<std::size_t>(src)].resize(b.sizes[static_cast<std::size_t>(src)]);
        exchange_bytes(b.send, dst, b.parts[static_cast<std::size_t>(src)], src);
      }
      return finish(std::move(b.parts));
    }
    const layout sl = layout_of(b.mine), rl = layout_of(b.sizes);
    b.send.clear();
    b.send.reserve(send_total);
    for (const bytes& m : to) b.send.insert(b.send.end(), m.begin(), m.end());
    b.recv.assign(recv_total, std::byte{0});
    wait_for("MPI_Ialltoallv", [&](MPI_Request* r) {
      return MPI_Ialltoallv(b.send.data(), sl.counts.data(), sl.displs.data(), MPI_BYTE,
                            b.recv.data(), rl.counts.data(), rl.displs.data(), MPI_BYTE, comm_, r);
    });
    return finish(split(b.recv, rl));
  }

  /// Returns once every rank has entered it (MPI_Ibarrier).
  void barrier() {
    start("barrier");
    wait_for("MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
    finish();
  }

 private:
  static constexpr std::size_t step = std::size_t{1} << 30;  // bytes per MPI call
  static constexpr int tag = 0x6361;                         // point-to-point messages
  static constexpr int report_tag = 0x6362;                  // "I gave up at collective #k"

  /// What a collective's MPI calls read and write: owned here, so that a collective left
  /// pending by a timeout never writes into freed memory.
  struct op_buffers {
    std::vector<std::uint64_t> mine, sizes, flag;
    bytes send, recv;
    std::vector<bytes> parts;  // per-rank messages of collectives over 2 GiB
    MPI_Comm comms[2] = {MPI_COMM_NULL, MPI_COMM_NULL};  // duplicate()'s new communicators
  };

  /// Adopts communicators made by `duplicate()`.
  mpi_communicator(MPI_Comm comm, MPI_Comm watch, std::chrono::milliseconds deadline)
      : comm_(comm), watch_(watch), deadline_(deadline) {
    adopt();
  }
  /// MPI errors on both communicators return instead of aborting; rank and size are read.
  void adopt() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(watch_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  /// MPI's int counts and displacements of buffers of `sizes` bytes laid end to end (their
  /// total fits an int).
  struct layout {
    std::vector<int> counts, displs;
  };
  static layout layout_of(const std::vector<std::uint64_t>& sizes) {
    layout l{std::vector<int>(sizes.size()), std::vector<int>(sizes.size())};
    int off = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      l.counts[r] = static_cast<int>(sizes[r]);
      l.displs[r] = off;
      off += l.counts[r];
    }
    return l;
  }
  /// `all` cut into one buffer per rank, as `l` lays it out.
  static std::vector<bytes> split(const bytes& all, const layout& l) {
    std::vector<bytes> out(l.counts.size());
    for (std::size_t r = 0; r < out.size(); ++r)
      out[r].assign(all.begin() + l.displs[r], all.begin() + l.displs[r] + l.counts[r]);
    return out;
  }
  void check_root(int root, const char* what) const {
    if (root < 0 || root >= size_)
      throw exception(
          make_error(errc::invalid_argument, std::string(what) + " root " + std::to_string(root) +
                                                 " is not a rank of " + std::to_string(size_)));
  }

  op_buffers& buffers() { return *current_; }

  /// Starts collective `what`: fails at once after a timeout here, or when another rank has
  /// reported one (this rank is then the one that came late).
  void start(const char* what) {
    if (!broken_.empty()) throw exception(make_error(errc::comm, broken_).with_rank(rank_));
    what_ = what;
    if (!current_) current_ = std::make_unique<op_buffers>();
    if (deadline_.count() == 0) return;
    int flag = 0;
    MPI_Status st;
    for (int i = 0; i < 3 && !flag; ++i)  // each probe also moves MPI's progress on
      detail::mpi_check(MPI_Iprobe(MPI_ANY_SOURCE, report_tag, watch_, &flag, &st), "MPI_Iprobe");
    if (!flag) return;
    std::vector<int> reporters;
    std::uint64_t at = 0;
    drain_reports(reporters, at);
    came_late(reporters, at);
  }

  /// Other ranks gave up waiting for this one: it throws, saying so.
  [[noreturn]] void came_late(const std::vector<int>& reporters, std::uint64_t at) {
    std::string who;
    for (int r : reporters) who += (who.empty() ? "" : ", ") + std::to_string(r);
    fail("rank(s) " + who + " gave up waiting at collective #" + std::to_string(at) +
         " (deadline " + std::to_string(deadline_.count()) + " ms): this rank came late, to " +
         what_ + " (collective #" + std::to_string(collectives_) + ")");
  }
  /// Ends the collective in progress (returning its result, for those that have one).
  void finish() { ++collectives_; }
  std::vector<bytes> finish(std::vector<bytes> result) {
    ++collectives_;
    return result;
  }

  /// Posts one non-blocking MPI call through `post(&request)` and waits for it until the
  /// deadline (blocking forever with a deadline of zero).
  template <class Post>
  void wait_for(const char* call, Post&& post) {
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(post(&req), call);
    wait_all(&req, 1, call);
  }
  void wait_all(MPI_Request* reqs, int n, const char* call) {
    if (deadline_.count() == 0) {
      detail::mpi_check(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE), call);
      return;
    }
    using clock = std::chrono::steady_clock;
    const auto start = clock::now(), until = start + deadline_;
    for (std::uint64_t polls = 0;; ++polls) {
      int done = 0;
      detail::mpi_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), call);
      if (done) return;
      int flag = 0;
      MPI_Status st;
      detail::mpi_check(MPI_Iprobe(MPI_ANY_SOURCE, report_tag, watch_, &flag, &st), "MPI_Iprobe");
      if (flag || clock::now() >= until) give_up(flag != 0);
      // Spin briefly (small collectives finish in microseconds), then poll every 100 us.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  /// This rank stops waiting in the current collective: it tells every other rank, collects
  /// for a short grace the reports of those waiting in the same collective (who learn of the
  /// timeout from this report and answer at once), and throws naming the ranks that did not.
  /// `told`: a report came before this rank's own deadline passed.
  [[noreturn]] void give_up(bool told) {
    report();
    std::vector<bool> arrived(static_cast<std::size_t>(size_), false);
    arrived[static_cast<std::size_t>(rank_)] = true;
    using clock = std::chrono::steady_clock;
    const auto grace = std::min<std::chrono::milliseconds>(deadline_, std::chrono::seconds(2));
    const auto until = clock::now() + grace;
    int count = 1;
    std::vector<int> reporters;
    std::uint64_t at = 0;
    while (count < size_ && clock::now() < until) {
      drain_reports(reporters, at, &arrived, &count);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::string missing;
    for (int r = 0; r < size_; ++r)
      if (!arrived[static_cast<std::size_t>(r)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    // Every other rank is here and gave up: the one they waited for was this one.
    if (missing.empty() && told) came_late(reporters, at);
    if (missing.empty()) missing = "none (every rank reported)";
    fail("rank(s) " + missing + " did not arrive at " + what_ + " (collective #" +
         std::to_string(collectives_) + ") within " + std::to_string(deadline_.count()) + " ms");
  }

  /// Sends "this rank is at collective #n and gives up" to every other rank (once).
  void report() {
    if (reported_) return;
    reported_ = true;
    timed_out_.push_back(std::move(current_));  // the pending collective may still use them
    report_buf_ = {collectives_};
    report_reqs_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r)
      if (r != rank_)
        MPI_Isend(report_buf_.data(), 1, MPI_UINT64_T, r, report_tag, watch_,
                  &report_reqs_[static_cast<std::size_t>(r)]);
  }

  /// Receives every report that has arrived: who sent one, and at which collective. A rank that
  /// reports is waiting in a collective (this one, or one that does not need every rank, such
  /// as a gather's root still waiting while the others moved on): it is not the straggler.
  /// Answers with this rank's own report.
  void drain_reports(std::vector<int>& from,
                     std::uint64_t& at,
                     std::vector<bool>* arrived = nullptr,
                     int* count = nullptr) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      detail::mpi_check(MPI_Iprobe(MPI_ANY_SOURCE, report_tag, watch_, &flag, &st), "MPI_Iprobe");
      if (!flag) break;
      std::uint64_t k = 0;
      detail::mpi_check(
          MPI_Recv(&k, 1, MPI_UINT64_T, st.MPI_SOURCE, report_tag, watch_, MPI_STATUS_IGNORE),
          "MPI_Recv");
      from.push_back(st.MPI_SOURCE);
      at = k;
      if (arrived && !(*arrived)[static_cast<std::size_t>(st.MPI_SOURCE)]) {
        (*arrived)[static_cast<std::size_t>(st.MPI_SOURCE)] = true;
        ++*count;
      }
    }
    report();
  }

  [[noreturn]] void fail(std::string message) {
    if (current_) timed_out_.push_back(std::move(current_));
    broken_ = message;
    throw exception(make_error(errc::comm, std::move(message)).with_rank(rank_));
  }

  // Sends `out` to `dst` while receiving `in` (already sized) from `src`, either of them empty,
  // in messages of at most `step` bytes: the sends are posted first, so that two ranks
  // exchanging cannot deadlock.
  void exchange_bytes(std::span<const std::byte> out, int dst, std::span<std::byte> in, int src) {
    std::vector<MPI_Request> reqs;
    auto in_steps = [&](std::size_t size, auto post) {
      for (std::size_t off = 0; off < size; off += step) {
        reqs.emplace_back();
        post(off, static_cast<int>(std::min(step, size - off)), &reqs.back());
      }
    };
    in_steps(out.size(), [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Isend(out.data() + off, n, MPI_BYTE, dst, tag, comm_, r), "MPI_Isend");
    });
    in_steps(in.size(), [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Irecv(in.data() + off, n, MPI_BYTE, src, tag, comm_, r), "MPI_Irecv");
    });
    wait_all(reqs.data(), static_cast<int>(reqs.size()), "MPI_Isend/MPI_Irecv");
  }
  void broadcast_bytes(bytes& buf, int root) {
    for (std::size_t off = 0; off < buf.size(); off += step) {
      int n = static_cast<int>(std::min(step, buf.size() - off));
      wait_for("MPI_Ibcast", [&](MPI_Request* r) {
        return MPI_Ibcast(buf.data() + off, n, MPI_BYTE, root, comm_, r);
      });
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm watch_ = MPI_COMM_NULL;  // timeout reports only
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds deadline_;
  std::uint64_t collectives_ = 0;  // collectives completed, for messages
  const char* what_ = "";          // the collective in progress
  std::unique_ptr<op_buffers> current_;
  std::vector<std::unique_ptr<op_buffers>> timed_out_;  // kept while MPI may still use them
  std::vector<std::uint64_t> report_buf_;
  std::vector<MPI_Request> report_reqs_;
  bool reported_ = false;
  std::string broken_;  // why the communicator is unusable; empty while it is usable
};

/// Initializes MPI and finalizes it at scope exit, unless the program had already initialized
/// it. It asks for MPI_THREAD_MULTIPLE, so that an async save commits from its background
/// thread on a duplicate communicator (`mpi_communicator::duplicate`) as soon as every rank
/// has written; with a lower level (what the library provides, or what a program that
/// initialized MPI itself asked for) the commit waits for the next collective call on the
/// training thread.
class mpi_environment {
 public:
  mpi_environment(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = MPI_THREAD_SINGLE;
    detail::mpi_check(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided),
                      "MPI_Init_thread");
    owns_ = true;
  }
  /// The thread level MPI provided (MPI_Query_thread), whoever initialized it.
  int thread_level() const noexcept {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level;
  }
  ~mpi_environment() {
    if (owns_) MPI_Finalize();
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;

 private:
  bool owns_ = false;
};

static_assert(scalable_communicator<mpi_communicator>);
static_assert(duplicable_communicator<mpi_communicator>);

}  // namespace cairn
