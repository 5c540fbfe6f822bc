// cairn/comm/single.hpp: single_communicator, the communicator of a process that runs alone
// (rank 0 of 1). Every collective is local: all_gather and gather return one copy, all_to_all
// returns what it was given, broadcast and barrier do nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/detail/config.hpp"

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
  std::vector<bytes> all_gather(std::span<const std::byte> data);

  /// Leaves `buf` unchanged. Throws `cairn::exception` (errc::invalid_argument) when `root` is
  /// not 0.
  void broadcast(bytes& buf, int root);

  /// Returns at once.
  void barrier() noexcept {}

  /// One copy of `data` (root must be 0).
  std::vector<bytes> gather(std::span<const std::byte> data, int root);

  /// `to[0]`, sent to itself.
  std::vector<bytes> all_to_all(const std::vector<bytes>& to);

  /// Another single communicator (it shares nothing, so any thread may use it).
  std::unique_ptr<single_communicator> duplicate() const {
    return std::make_unique<single_communicator>();
  }
};

static_assert(scalable_communicator<single_communicator>);
static_assert(duplicable_communicator<single_communicator>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/comm/single-inl.hpp"
#endif
