// Scalable save planning (plan/scalable.hpp) over MPI processes: every element of every tensor
// is written once, from a holder; an overlap fails on every process with the same error.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "tests/plan/scalable_cases.hpp"

using namespace cairn_test;

TEST_CASE("scalable planning under mpirun writes every element once, from a holder") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int world = comm.size(), rank = comm.rank();
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    INFO("seed " << seed);
    auto d = random_world(world, seed * 31 + static_cast<std::uint32_t>(world), 24);
    auto got = cairn::scalable_plan(d[static_cast<std::size_t>(rank)], std::nullopt, comm, true,
                                    256, 64, true);
    REQUIRE(got);
    written_counts counts;
    check_rank_index(d, static_cast<std::size_t>(rank), *got, counts);
    std::vector<int> mine = flat_counts(d, counts), all(mine.size());
    MPI_Allreduce(mine.data(), all.data(), static_cast<int>(mine.size()), MPI_INT, MPI_SUM,
                  MPI_COMM_WORLD);
    CHECK(std::all_of(all.begin(), all.end(), [](int c) { return c == 1; }));
  }
}

TEST_CASE("scalable planning under mpirun: an overlap fails on every process alike") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int world = comm.size(), rank = comm.rank();
  auto d = random_world(world, 5, 12);
  d[0].tensors.push_back(
      cairn::tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {cairn::box{{0, 0}, {5, 2}}}});
  d[static_cast<std::size_t>(world - 1)].tensors.push_back(
      cairn::tensor_desc{"clash", cairn::dtype::f32, {8, 2}, 0, {cairn::box{{4, 0}, {4, 2}}}});
  auto got = cairn::scalable_plan(d[static_cast<std::size_t>(rank)], std::nullopt, comm, true, 256,
                                  64, true);
  REQUIRE(!got);
  std::string m = got.err().describe();
  CHECK(m.find("shards overlap") != std::string::npos);
  auto all = comm.all_gather(std::as_bytes(std::span(m.data(), m.size())));
  for (const auto& b : all)
    CHECK(std::string(reinterpret_cast<const char*>(b.data()), b.size()) == m);
}
