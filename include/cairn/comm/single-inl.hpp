// cairn/comm/single-inl.hpp: the bodies of cairn/comm/single.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/comm/single.hpp"
#include "cairn/core/error.hpp"

namespace cairn {

CAIRN_INLINE std::vector<bytes> single_communicator::all_gather(std::span<const std::byte> data) {
  std::vector<bytes> out(1);
  out[0].assign(data.begin(), data.end());
  return out;
}

CAIRN_INLINE void single_communicator::broadcast(bytes& buf, int root) {
  (void)buf;
  if (root != 0) {
    throw exception(
        make_error(errc::invalid_argument, "broadcast root " + std::to_string(root) +
                                               " is out of range for a communicator of size 1")
            .with_rank(0));
  }
}

CAIRN_INLINE std::vector<bytes> single_communicator::gather(std::span<const std::byte> data,
                                                            int root) {
  if (root != 0) {
    throw exception(
        make_error(errc::invalid_argument, "gather root " + std::to_string(root) +
                                               " is out of range for a communicator of size 1")
            .with_rank(0));
  }
  return all_gather(data);
}

CAIRN_INLINE std::vector<bytes> single_communicator::all_to_all(const std::vector<bytes>& to) {
  if (to.size() != 1)
    throw exception(
        make_error(errc::invalid_argument,
                   "all_to_all needs one buffer per rank (1), got " + std::to_string(to.size()))
            .with_rank(0));
  return to;
}

}  // namespace cairn
