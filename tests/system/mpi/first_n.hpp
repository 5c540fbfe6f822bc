// A sub-communicator of MPI_COMM_WORLD's first n processes, for tests that save on N processes
// and load on M within one mpirun.
#pragma once

#include <mpi.h>

namespace cairn_test {

/// A sub-communicator of the first `n` processes (MPI_COMM_NULL on the others), freed at scope
/// exit.
struct first_n {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit first_n(int n) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &comm);
  }
  ~first_n() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  first_n(const first_n&) = delete;
  first_n& operator=(const first_n&) = delete;
};

}  // namespace cairn_test
