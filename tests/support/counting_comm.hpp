// tests/support/counting_comm.hpp: any communicator (thread ranks, MPI) logging every
// collective a rank calls, with the bytes it sent and received, so that a test can bound what a
// save or a load exchanges.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"

namespace cairn_test {

/// One collective as one rank saw it: its kind and the bytes this rank sent and received.
struct collective_use {
  std::string kind;
  std::size_t sent = 0, received = 0;
};

/// A communicator that appends each collective this rank calls through it to `*log`.
struct counting_comm {
  cairn::comm_ref inner;
  std::vector<collective_use>* log;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  static std::size_t total(const std::vector<cairn::bytes>& v) {
    std::size_t n = 0;
    for (const auto& b : v) n += b.size();
    return n;
  }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
    auto out = inner.all_gather(in);
    log->push_back({"all_gather", in.size(), total(out) - in.size()});
    return out;
  }
  std::vector<cairn::bytes> gather(std::span<const std::byte> in, int root) {
    auto out = inner.gather(in, root);
    log->push_back(
        {"gather", rank() == root ? 0 : in.size(), rank() == root ? total(out) - in.size() : 0});
    return out;
  }
  std::vector<cairn::bytes> all_to_all(const std::vector<cairn::bytes>& to) {
    auto out = inner.all_to_all(to);
    auto self = static_cast<std::size_t>(rank());
    log->push_back({"all_to_all", total(to) - to[self].size(), total(out) - out[self].size()});
    return out;
  }
  void broadcast(cairn::bytes& b, int root) {
    std::size_t before = b.size();
    inner.broadcast(b, root);
    log->push_back({"broadcast", rank() == root ? before * static_cast<std::size_t>(size() - 1) : 0,
                    rank() == root ? 0 : b.size()});
  }
  void barrier() { inner.barrier(); }

  /// The bytes this rank received in every collective it logged.
  static std::size_t received(const std::vector<collective_use>& log) {
    std::size_t n = 0;
    for (const auto& u : log) n += u.received;
    return n;
  }
};
static_assert(cairn::scalable_communicator<counting_comm>);

}  // namespace cairn_test
