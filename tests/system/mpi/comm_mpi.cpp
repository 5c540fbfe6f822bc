// The communicator conformance suite over MPI processes.
#include <doctest/doctest.h>

#include "cairn/comm/mpi.hpp"
#include "tests/comm/conformance.hpp"

namespace conf = cairn::conformance;

namespace {
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
template <class F>
void spmd(F&& f) {
  cairn::mpi_communicator c(MPI_COMM_WORLD);
  f(c);
}
}  // namespace

TEST_SUITE("mpi comm conformance") {
  TEST_CASE("rank and size") {
    spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::rank_and_size(x, world_size()); });
    });
  }
  TEST_CASE("all_gather of variable-size payloads") {
    spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::all_gather_variable_sizes(x); });
    });
  }
  TEST_CASE("gather to every root") {
    spmd([](auto& c) { conf::run_with_fallback(c, [](auto& x) { conf::gather_every_root(x); }); });
  }
  TEST_CASE("all_to_all of variable-size messages") {
    spmd([](auto& c) {
      conf::run_with_fallback(c, [](auto& x) { conf::all_to_all_variable_sizes(x); });
    });
  }
  TEST_CASE("broadcast from every root") {
    spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::broadcast_every_root(x); });
    });
  }
  TEST_CASE("barrier") {
    spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::barrier_orders(x, nullptr); });
    });
  }
  TEST_CASE("mixed collectives back to back") {
    spmd([](auto& c) { conf::mixed_back_to_back(c, 300); });
  }
}

TEST_CASE("a bad broadcast root is an invalid argument on every rank") {
  spmd([](auto& c) { conf::bad_root_throws(c); });
}
