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
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
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
///     cairn::mpi_environment env(argc, argv);   // or MPI_Init_thread in the trainer
///     cairn::mpi_communicator comm(MPI_COMM_WORLD);
///     cairn::save(state, disk, comm);
class mpi_communicator {
 public:
  explicit mpi_communicator(MPI_Comm parent = MPI_COMM_WORLD) {
    detail::mpi_check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The duplicated MPI communicator cairn uses.
  MPI_Comm native() const noexcept { return comm_; }

  /// Another duplicate of this communicator (MPI_Comm_dup, collective), for a thread of this
  /// rank other than the one using this one: only when MPI was initialized with
  /// MPI_THREAD_MULTIPLE (`mpi_environment` asks for it), else null. Every rank of a job gets
  /// the same thread level, so every rank makes the same choice.
  std::unique_ptr<mpi_communicator> duplicate() const {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE) return nullptr;
    return std::make_unique<mpi_communicator>(comm_);
  }

  /// Every rank's buffer, by rank: MPI_Allgather of the sizes, then MPI_Allgatherv of the
  /// bytes (or per-rank broadcasts when the total exceeds MPI's int counts).
  std::vector<bytes> all_gather(std::span<const std::byte> in) {
    std::uint64_t mine = in.size();
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size_));
    detail::mpi_check(MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_),
                      "MPI_Allgather");
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    std::vector<bytes> out(static_cast<std::size_t>(size_));
    if (total <= static_cast<std::uint64_t>(INT_MAX)) {
      const layout l = layout_of(sizes);
      bytes all(total);
      detail::mpi_check(MPI_Allgatherv(in.data(), static_cast<int>(mine), MPI_BYTE, all.data(),
                                       l.counts.data(), l.displs.data(), MPI_BYTE, comm_),
                        "MPI_Allgatherv");
      return split(all, l);
    }
    for (int r = 0; r < size_; ++r) {
      out[r] = r == rank_ ? bytes(in.begin(), in.end()) : bytes(sizes[r]);
      broadcast_bytes(out[r], r);
    }
    return out;
  }

  /// Copies `buf` from `root` to every rank (MPI_Bcast of the size, then of the bytes).
  void broadcast(bytes& buf, int root) {
    check_root(root, "broadcast");
    std::uint64_t n = buf.size();
    detail::mpi_check(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm_), "MPI_Bcast");
    buf.resize(n);
    broadcast_bytes(buf, root);
  }

  /// Every rank's buffer on `root`, by rank (an empty vector elsewhere): MPI_Gather of the
  /// sizes, then MPI_Gatherv (or point-to-point messages when the total exceeds MPI's int
  /// counts).
  std::vector<bytes> gather(std::span<const std::byte> in, int root) {
    check_root(root, "gather");
    std::uint64_t mine = in.size();
    std::vector<std::uint64_t> sizes(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    detail::mpi_check(
        MPI_Gather(&mine, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, comm_),
        "MPI_Gather");
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    std::uint8_t small = total <= static_cast<std::uint64_t>(INT_MAX);
    detail::mpi_check(MPI_Bcast(&small, 1, MPI_UINT8_T, root, comm_), "MPI_Bcast");
    std::vector<bytes> out(sizes.size());
    if (small) {
      const layout l = layout_of(sizes);
      bytes all(total);
      detail::mpi_check(MPI_Gatherv(in.data(), static_cast<int>(mine), MPI_BYTE, all.data(),
                                    l.counts.data(), l.displs.data(), MPI_BYTE, root, comm_),
                        "MPI_Gatherv");
      return split(all, l);
    }
    if (rank_ != root) {
      send_bytes(in, root);
      return out;
    }
    for (int r = 0; r < size_; ++r) {
      if (r == root) {
        out[r].assign(in.begin(), in.end());
        continue;
      }
      out[r].resize(sizes[r]);
      recv_bytes(out[r], r);
    }
    return out;
  }

  /// What every rank sent to this one, by sender; `to[r]` goes to rank r: MPI_Alltoall of the
  /// sizes, then MPI_Alltoallv (or pairwise exchanges when a count exceeds MPI's ints).
  std::vector<bytes> all_to_all(const std::vector<bytes>& to) {
    if (to.size() != static_cast<std::size_t>(size_))
      throw exception(make_error(errc::invalid_argument, "all_to_all needs one buffer per rank (" +
                                                             std::to_string(size_) + "), got " +
                                                             std::to_string(to.size())));
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::uint64_t> send_sizes(n), recv_sizes(n);
    std::uint64_t send_total = 0, recv_total = 0;
    for (std::size_t r = 0; r < n; ++r) send_total += send_sizes[r] = to[r].size();
    detail::mpi_check(
        MPI_Alltoall(send_sizes.data(), 1, MPI_UINT64_T, recv_sizes.data(), 1, MPI_UINT64_T, comm_),
        "MPI_Alltoall");
    for (auto s : recv_sizes) recv_total += s;
    std::uint8_t small = std::max(send_total, recv_total) <= static_cast<std::uint64_t>(INT_MAX);
    std::uint8_t all_small = 0;
    detail::mpi_check(MPI_Allreduce(&small, &all_small, 1, MPI_UINT8_T, MPI_MIN, comm_),
                      "MPI_Allreduce");
    std::vector<bytes> out(n);
    if (!all_small) {
      out[static_cast<std::size_t>(rank_)] = to[static_cast<std::size_t>(rank_)];
      for (int k = 1; k < size_; ++k) {
        int dst = (rank_ + k) % size_, src = (rank_ - k + size_) % size_;
        out[static_cast<std::size_t>(src)].resize(recv_sizes[static_cast<std::size_t>(src)]);
        exchange_bytes(to[static_cast<std::size_t>(dst)], dst, out[static_cast<std::size_t>(src)],
                       src);
      }
      return out;
    }
    const layout sl = layout_of(send_sizes), rl = layout_of(recv_sizes);
    bytes send, recv(recv_total);
    send.reserve(send_total);
    for (const bytes& m : to) send.insert(send.end(), m.begin(), m.end());
    detail::mpi_check(
        MPI_Alltoallv(send.data(), sl.counts.data(), sl.displs.data(), MPI_BYTE, recv.data(),
                      rl.counts.data(), rl.displs.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv");
    return split(recv, rl);
  }

  void barrier() { detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  static constexpr std::size_t step = std::size_t{1} << 30;  // bytes per MPI call
  static constexpr int tag = 0x6361;                         // point-to-point messages

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
  void send_bytes(std::span<const std::byte> b, int dst) {
    for (std::size_t off = 0; off < b.size(); off += step) {
      int n = static_cast<int>(std::min(step, b.size() - off));
      detail::mpi_check(MPI_Send(b.data() + off, n, MPI_BYTE, dst, tag, comm_), "MPI_Send");
    }
  }
  void recv_bytes(bytes& b, int src) {
    for (std::size_t off = 0; off < b.size(); off += step) {
      int n = static_cast<int>(std::min(step, b.size() - off));
      detail::mpi_check(MPI_Recv(b.data() + off, n, MPI_BYTE, src, tag, comm_, MPI_STATUS_IGNORE),
                        "MPI_Recv");
    }
  }
  // Sends `out` to `dst` while receiving `in` (already sized) from `src`, each in 1 GiB
  // messages: the sends are posted first, so that two ranks exchanging cannot deadlock.
  void exchange_bytes(std::span<const std::byte> out, int dst, bytes& in, int src) {
    std::vector<MPI_Request> sends;
    for (std::size_t off = 0; off < out.size(); off += step) {
      int n = static_cast<int>(std::min(step, out.size() - off));
      sends.emplace_back();
      detail::mpi_check(MPI_Isend(out.data() + off, n, MPI_BYTE, dst, tag, comm_, &sends.back()),
                        "MPI_Isend");
    }
    recv_bytes(in, src);
    detail::mpi_check(
        MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
  }
  void broadcast_bytes(bytes& buf, int root) {
    for (std::size_t off = 0; off < buf.size(); off += step) {
      int n = static_cast<int>(std::min(step, buf.size() - off));
      detail::mpi_check(MPI_Bcast(buf.data() + off, n, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
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
