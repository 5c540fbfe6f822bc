// cairn/comm/single.hpp: single_communicator, the communicator of a process that runs alone
// (rank 0 of 1). Every collective is local: all_gather and gather return one copy, all_to_all
// returns what it was given, broadcast and barrier do nothing.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"

namespace cairn {

/// The communicator of a single process: rank 0 of a world of size 1.
///
/// `cairn::single_communicator comm; cairn::save(state, disk, comm);`
class single_communicator {
 public:
  /// Always 0.
  int rank() const noexcept { return 0; }
  /// Always 1.
  int size() const noexcept { return 1; }

  /// Returns one buffer: a copy of `data`.
  std::vector<bytes> all_gather(std::span<const std::byte> data) {
    std::vector<bytes> out(1);
    out[0].assign(data.begin(), data.end());
    return out;
  }

  /// Leaves `buf` unchanged. Throws `cairn::exception` (errc::invalid_argument) when `root` is
  /// not 0.
  void broadcast(bytes& buf, int root) {
    (void)buf;
    if (root != 0) {
      throw exception(
          make_error(errc::invalid_argument, "broadcast root " + std::to_string(root) +
                                                 " is out of range for a communicator of size 1")
              .with_rank(0));
    }
  }

  /// Returns at once.
  void barrier() noexcept {}

  /// One copy of `data` (root must be 0).
  std::vector<bytes> gather(std::span<const std::byte> data, int root) {
    if (root != 0) {
      throw exception(
          make_error(errc::invalid_argument, "gather root " + std::to_string(root) +
                                                 " is out of range for a communicator of size 1")
              .with_rank(0));
    }
    return all_gather(data);
  }

  /// `to[0]`, sent to itself.
  std::vector<bytes> all_to_all(const std::vector<bytes>& to) {
    if (to.size() != 1)
      throw exception(
          make_error(errc::invalid_argument,
                     "all_to_all needs one buffer per rank (1), got " + std::to_string(to.size()))
              .with_rank(0));
    return to;
  }
};

static_assert(scalable_communicator<single_communicator>);

}  // namespace cairn
