// cairn::torch under mpirun: a tensor-parallel module and its AdamW state saved on the first N
// processes load on the first M (N, M in 1..world size) over a shared directory, into fresh
// modules and optimizers; every piece equals the one-rank reference's piece.
#include <filesystem>

#include "cairn/cairn.hpp"
#include "cairn/comm/mpi.hpp"
#include "cairn/libtorch.hpp"
#include "tests/libtorch/doctest_after_torch.hpp"
#include "tests/libtorch/tp_model.hpp"
#include "tests/support/test_util.hpp"
#include "tests/system/mpi/first_n.hpp"

using namespace cairn_test;

TEST_CASE("a tensor-parallel module and its AdamW state on N processes load on M") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cairn::mpi_communicator all(MPI_COMM_WORLD);
  const std::string root = shared_temp_dir(all);
  tp_block ref(1);
  fill(ref, 0, 1, 2.0);
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
  adamw_step(ref, ref_opt, 0, 1, 2.0);
  int combos = 0;
  for (int n = 1; n <= world; ++n) {
    for (int m = 1; m <= world; ++m) {
      if (tp_hidden % n != 0 || tp_hidden % m != 0) continue;
      const std::string dir = root + "/n" + std::to_string(n) + "m" + std::to_string(m);
      std::vector<std::string> failures;
      {
        first_n sub(n);
        if (sub.comm != MPI_COMM_NULL) {
          try {
            cairn::mpi_communicator comm(sub.comm);
            tp_block b(n);
            fill(b, comm.rank(), n, 2.0);
            torch::optim::AdamW opt(b->parameters(), torch::optim::AdamWOptions(1e-2));
            adamw_step(b, opt, comm.rank(), n, 2.0);
            cairn::file_storage disk(dir);
            cairn::save(tp_state(b, opt, comm.rank(), n), disk, comm);
          } catch (const std::exception& e) {
            failures.push_back(std::string("save threw: ") + e.what());
          }
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      {
        first_n sub(m);
        if (sub.comm != MPI_COMM_NULL) {
          try {
            cairn::mpi_communicator comm(sub.comm);
            tp_block b(m);
            torch::optim::AdamW opt(b->parameters(), torch::optim::AdamWOptions(0.5));
            auto sd = tp_state(b, opt, comm.rank(), m);
            cairn::file_storage disk(dir);
            cairn::load(sd, disk, comm);
            failures = loaded_mismatches(b, opt, ref, ref_opt, comm.rank(), m);
          } catch (const std::exception& e) {
            failures.push_back(std::string("load threw: ") + e.what());
          }
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      INFO("N=" << n << " M=" << m);
      CHECK(failures.empty());
      for (auto& f : failures) MESSAGE(f);
      ++combos;
    }
  }
  CHECK(combos >= 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (all.rank() == 0) std::filesystem::remove_all(root);
}
