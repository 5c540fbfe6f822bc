// The doctest main for tests that run as real processes under mpirun: every process runs the
// same test cases in the same order (their collectives must match), and the exit code is
// non-zero on every process when any process failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "cairn/comm/mpi.hpp"

int main(int argc, char** argv) {
  cairn::mpi_environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  // One report (failures still count below); CAIRN_TEST_ALL_RANKS=1 prints every rank's.
  const char* all = std::getenv("CAIRN_TEST_ALL_RANKS");
  if (rank != 0 && !(all && std::string(all) == "1")) ctx.setOption("out", "/dev/null");
  int failed = ctx.run() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed)
    std::fprintf(stderr,
                 "rank %d: test failures (run with CAIRN_TEST_ALL_RANKS=1 for its report)\n", rank);
  return any;
}
