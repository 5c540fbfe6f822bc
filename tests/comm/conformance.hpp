// tests/comm/conformance.hpp: the conformance cases every communicator runs.
//
// Each case is SPMD: every rank of the world calls it with its own communicator, at the same
// point, and checks with doctest's CHECK macros (safe from several threads in doctest 2.4.9:
// its counters are atomic and its reporters lock a mutex). Cases take any `communicator`,
// including `cairn::comm_ref`; `run_direct_and_ref` runs a case both ways.
//
// To run the suite for a new communicator, give it a world type with `spmd(f)` that calls
// `f(comm)` on every rank (see conformance_test.cpp for single and thread ranks; an MPI test
// would construct `mpi_communicator{MPI_COMM_WORLD}` in each process and call `f` once) and
// instantiate the same TEST_CASE_TEMPLATEs. Cases that need memory shared by all ranks take a
// pointer that an MPI world passes as nullptr.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"

namespace cairn::conformance {

/// Deterministic bytes that identify (who, step, index): different ranks and steps differ.
inline bytes pattern(int who, int step, std::size_t size) {
  bytes b(size);
  std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(who + 1) +
                    0x85ebca6bu * static_cast<std::uint32_t>(step + 7);
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<std::byte>(x & 0xffu);
  }
  return b;
}

/// Runs `run_case(c)` on the communicator itself, then through a `comm_ref` wrapping it.
template <communicator C, class Case>
void run_direct_and_ref(C& c, Case&& run_case) {
  run_case(c);
  comm_ref ref(c);
  run_case(ref);
}

/// rank() and size() are consistent: size matches the world, ranks are 0..size-1, each once.
template <communicator C>
void rank_and_size(C& c, int expected_size) {
  const int n = c.size();
  const int r = c.rank();
  CHECK(n == expected_size);
  CHECK(r >= 0);
  CHECK(r < n);
  bytes mine(sizeof(int));
  std::copy_n(reinterpret_cast<const std::byte*>(&r), sizeof(int), mine.data());
  auto all = c.all_gather(mine);
  REQUIRE(all.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    int got = -1;
    REQUIRE(all[static_cast<std::size_t>(i)].size() == sizeof(int));
    std::copy_n(all[static_cast<std::size_t>(i)].data(), sizeof(int),
                reinterpret_cast<std::byte*>(&got));
    CHECK(got == i);
  }
}

/// The payload size rank `r` of `n` contributes at `step` of all_gather_variable_sizes.
inline std::size_t gather_size(int step, int r, int n) {
  switch (step) {
    case 0:
      return static_cast<std::size_t>(r);  // rank 0 sends nothing
    case 1:
      return 0;  // nobody sends anything
    case 2:
      return static_cast<std::size_t>(n - r) * 37;  // decreasing
    case 3:
      return r == n - 1 ? (1u << 20) + 3 : 1;  // one large, others tiny
    default:
      return static_cast<std::size_t>((r * 7 + step) % 5);  // some zero
  }
}

/// all_gather of rank-dependent, variable-size payloads (including empty ones) returns every
/// rank's bytes, in rank order, on every rank.
template <communicator C>
void all_gather_variable_sizes(C& c) {
  const int n = c.size();
  const int r = c.rank();
  for (int step = 0; step < 8; ++step) {
    const bytes mine = pattern(r, step, gather_size(step, r, n));
    const auto all = c.all_gather(mine);
    REQUIRE(all.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      INFO("rank " << r << " step " << step << " from rank " << i);
      CHECK(all[static_cast<std::size_t>(i)] == pattern(i, step, gather_size(step, i, n)));
    }
  }
  // An empty span, not just an empty vector.
  const auto none = c.all_gather(std::span<const std::byte>());
  REQUIRE(none.size() == static_cast<std::size_t>(n));
  for (const auto& b : none) CHECK(b.empty());
}

/// broadcast from every root, with empty, small and large payloads, replaces (and resizes)
/// every other rank's buffer with the root's bytes and leaves the root's buffer unchanged.
template <communicator C>
void broadcast_every_root(C& c) {
  const int n = c.size();
  const int r = c.rank();
  for (int root = 0; root < n; ++root) {
    for (std::size_t size :
         {std::size_t{0}, std::size_t{1}, std::size_t{1000} + root, std::size_t{300'000}}) {
      const bytes expected = pattern(root, static_cast<int>(size), size);
      // Non-roots start with junk of a different size, to check the resize both ways.
      bytes buf =
          r == root ? expected : bytes(static_cast<std::size_t>(r) * 3 + 5, std::byte{0xee});
      c.broadcast(buf, root);
      INFO("rank " << r << " root " << root << " size " << size);
      CHECK(buf == expected);
    }
  }
}

/// barrier() returns only after every rank has entered it. With `shared` (a counter all ranks
/// see, starting at 0; pass nullptr where ranks share no memory), each round increments it
/// before the barrier and checks after it that every rank's increment is there.
template <communicator C>
void barrier_orders(C& c, std::atomic<int>* shared) {
  const int n = c.size();
  constexpr int rounds = 50;
  for (int k = 0; k < rounds; ++k) {
    if (shared) shared->fetch_add(1, std::memory_order_relaxed);
    c.barrier();
    if (shared) {
      const int seen = shared->load(std::memory_order_relaxed);
      if (seen != n * (k + 1)) CHECK(seen == n * (k + 1));  // one report per bad round
    }
    c.barrier();  // nobody starts the next round until all have checked
  }
  // Ranks leave a run of barriers together: everybody agrees which round this is.
  bytes mine = pattern(rounds, 0, 4);
  for (const auto& b : c.all_gather(mine)) CHECK(b == mine);
}

/// `iterations` back-to-back collectives of every kind, sizes and roots varying per step and
/// per rank, complete without deadlock and with the right bytes.
template <communicator C>
void mixed_back_to_back(C& c, int iterations = 1000) {
  const int n = c.size();
  const int r = c.rank();
  int bad = 0;
  int first_bad = -1;
  for (int i = 0; i < iterations; ++i) {
    bool ok = true;
    switch (i % 3) {
      case 0: {
        const auto size_of = [&](int who) { return static_cast<std::size_t>((who + i) % 5) * 3; };
        const auto all = c.all_gather(pattern(r, i, size_of(r)));
        ok = all.size() == static_cast<std::size_t>(n);
        for (int w = 0; ok && w < n; ++w) {
          ok = all[static_cast<std::size_t>(w)] == pattern(w, i, size_of(w));
        }
        break;
      }
      case 1: {
        const int root = (i / 3) % n;
        const std::size_t size = static_cast<std::size_t>(i % 7);
        bytes buf = r == root ? pattern(root, i, size) : bytes(static_cast<std::size_t>(r));
        c.broadcast(buf, root);
        ok = buf == pattern(root, i, size);
        break;
      }
      default:
        c.barrier();
        break;
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  INFO("rank " << r << ": first bad iteration " << first_bad);
  CHECK(bad == 0);
}

/// gather to every root, with variable sizes (empty ones too): the root receives every rank's
/// bytes in rank order, the other ranks an empty vector.
template <class C>
void gather_every_root(C& c) {
  const int n = c.size();
  const int r = c.rank();
  for (int root = 0; root < n; ++root) {
    for (int step = 0; step < 5; ++step) {
      const bytes mine = pattern(r, step + 10 * root, gather_size(step, r, n));
      const auto got = c.gather(mine, root);
      INFO("rank " << r << " root " << root << " step " << step);
      if (r != root) {
        CHECK(got.empty());
        continue;
      }
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i)
        CHECK(got[static_cast<std::size_t>(i)] ==
              pattern(i, step + 10 * root, gather_size(step, i, n)));
    }
  }
}

/// The size rank `from` sends rank `to` at `step` of all_to_all_variable_sizes.
inline std::size_t message_size(int step, int from, int to) {
  switch (step) {
    case 0:
      return 0;
    case 1:
      return static_cast<std::size_t>(from * 3 + to);
    case 2:
      return from == to ? 100'000 : 1;
    default:
      return static_cast<std::size_t>((from * 5 + to * 3 + step) % 7) * 11;
  }
}

/// all_to_all delivers to each rank exactly what every rank addressed to it, by sender, with
/// variable (and empty) sizes.
template <class C>
void all_to_all_variable_sizes(C& c) {
  const int n = c.size();
  const int r = c.rank();
  for (int step = 0; step < 6; ++step) {
    std::vector<bytes> to;
    for (int d = 0; d < n; ++d) to.push_back(pattern(r * 64 + d, step, message_size(step, r, d)));
    const auto got = c.all_to_all(to);
    REQUIRE(got.size() == static_cast<std::size_t>(n));
    for (int s = 0; s < n; ++s) {
      INFO("rank " << r << " step " << step << " from rank " << s);
      CHECK(got[static_cast<std::size_t>(s)] ==
            pattern(s * 64 + r, step, message_size(step, s, r)));
    }
  }
}

/// A communicator with only the base collectives, so that `comm_ref` builds gather and
/// all_to_all from all_gather.
template <communicator C>
struct base_only {
  C& inner;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  std::vector<bytes> all_gather(std::span<const std::byte> in) { return inner.all_gather(in); }
  void broadcast(bytes& b, int root) { inner.broadcast(b, root); }
  void barrier() { inner.barrier(); }
};

/// Runs `run_case` on a scalable communicator directly, through `comm_ref`, and through a
/// `comm_ref` over its base collectives only (the fallbacks).
template <communicator C, class Case>
void run_with_fallback(C& c, Case&& run_case) {
  if constexpr (scalable_communicator<C>) run_case(c);
  comm_ref ref(c);
  CHECK(ref.scalable() == scalable_communicator<C>);
  run_case(ref);
  base_only<C> base{c};
  comm_ref fallback(base);
  CHECK(!fallback.scalable());
  run_case(fallback);
}

/// A broadcast root outside [0, size) throws errc::invalid_argument when every rank passes
/// it. May leave the communicator unusable: run it last, on a communicator of its own.
template <communicator C>
void bad_root_throws(C& c) {
  bytes buf = pattern(c.rank(), 0, 8);
  for (int root : {c.size(), -1}) {
    try {
      c.broadcast(buf, root);
      FAIL_CHECK("broadcast with root " << root << " did not throw");
    } catch (const cairn::exception& e) {
      CHECK(e.err().code == errc::invalid_argument);
    }
  }
}

}  // namespace cairn::conformance
