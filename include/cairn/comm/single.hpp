// cairn/comm/single.hpp: single_communicator, the communicator of a process that runs alone
// (rank 0 of 1). Every collective is local: all_gather returns one copy, broadcast and barrier
// do nothing.
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
};

static_assert(communicator<single_communicator>);

}  // namespace cairn
