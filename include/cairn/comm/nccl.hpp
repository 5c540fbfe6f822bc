// cairn/comm/nccl.hpp: NCCL between device buffers, for "read once, broadcast" on load: one
// rank reads a replicated tensor and broadcasts it to the others' device memory.
//
// Needs the cairn::nccl CMake target (NCCL and the CUDA runtime). The NCCL communicator is
// bootstrapped through any cairn communicator (its unique id is broadcast from rank 0), so it
// works beside MPI or thread ranks.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"

namespace cairn {

/// An NCCL communicator over the ranks of a cairn communicator, one device per rank. Collectives
/// are enqueued on a CUDA stream and run asynchronously: synchronize the stream before using
/// the data on the host. Move-only; destroying it destroys the NCCL communicator.
///
///     auto nc = cairn::nccl_communicator::create(comm, /*device=*/local_rank).value();
///     nc.broadcast(dev_ptr, bytes, /*root=*/0, stream).value();
///     cudaStreamSynchronize(stream);
class nccl_communicator {
 public:
  /// Creates the NCCL communicator collectively: every rank of `bootstrap` calls it on the
  /// thread that runs cairn's collectives, with the device it uses. Errors (no device, NCCL
  /// failure) are errc::comm with NCCL's or CUDA's message; a failure on one rank can leave the
  /// others waiting inside NCCL, as with any NCCL initialization.
  static result<nccl_communicator> create(comm_ref bootstrap, int device) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
      return make_error(errc::comm, std::string("cudaSetDevice(") + std::to_string(device) +
                                        "): " + cudaGetErrorString(e));
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
        return make_error(errc::comm, std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
    }
    bytes buf(sizeof id);
    std::memcpy(buf.data(), &id, sizeof id);
    bootstrap.broadcast(buf, 0);
    std::memcpy(&id, buf.data(), sizeof id);
    nccl_communicator c;
    if (ncclResult_t r = ncclCommInitRank(&c.comm_, bootstrap.size(), id, bootstrap.rank());
        r != ncclSuccess)
      return make_error(errc::comm, std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
    c.rank_ = bootstrap.rank();
    c.size_ = bootstrap.size();
    return c;
  }

  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), rank_(o.rank_), size_(o.size_) {}
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      destroy();
      comm_ = std::exchange(o.comm_, nullptr);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  ~nccl_communicator() { destroy(); }

  /// This rank's index.
  int rank() const noexcept { return rank_; }
  /// Number of ranks.
  int size() const noexcept { return size_; }

  /// Enqueues on `stream` a broadcast of `bytes` bytes of device memory from `root`'s `buf` into
  /// every other rank's `buf` (each rank passes its own device buffer of the same size). Every
  /// rank calls it in the same order. Errors are errc::comm with NCCL's message.
  result<void> broadcast(void* buf, std::size_t bytes, int root, cudaStream_t stream) {
    return broadcast(buf, buf, bytes, root, stream);
  }

  /// Enqueues on `stream` a broadcast of `bytes` bytes of device memory from `root`'s `send`
  /// into every rank's `recv`, the root's own included (`send` is read on `root` only; it may be
  /// `recv`). Every rank calls it in the same order. Errors are errc::comm with NCCL's message.
  result<void> broadcast(
      const void* send, void* recv, std::size_t bytes, int root, cudaStream_t stream) {
    ncclResult_t r = ncclBroadcast(send, recv, bytes, ncclUint8, root, comm_, stream);
    if (r != ncclSuccess)
      return make_error(errc::comm, std::string("ncclBroadcast: ") + ncclGetErrorString(r));
    return ok();
  }

  /// The NCCL communicator, for calls cairn does not wrap.
  ncclComm_t native() const noexcept { return comm_; }

 private:
  nccl_communicator() = default;
  void destroy() noexcept {
    if (comm_) (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace cairn
