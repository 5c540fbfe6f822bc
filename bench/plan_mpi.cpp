// bench/plan_mpi.cpp: `cairn-bench-plan-mpi`: scalable save planning for real over MPI
// processes (bench/plan_real.hpp); rank 0 prints every rank's figures as JSON.
//
//   mpirun --oversubscribe -np 64 build/bin/cairn-bench-plan-mpi --tensors 2000 [--pp 2]
#include <cstdio>
#include <string>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "plan_real.hpp"

int main(int argc, char** argv) {
  cairn::mpi_environment env(argc, argv);
  int tensors = 1000, pp = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tensors")
      tensors = std::stoi(argv[i + 1]);
    else if (a == "--pp")
      pp = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: cairn-bench-plan-mpi [--tensors T] [--pp P]\n");
      return 2;
    }
  }
  try {
    cairn::mpi_communicator comm(MPI_COMM_WORLD);
    cairn_bench::grid g = cairn_bench::make_grid(comm.size(), tensors, pp);
    cairn_bench::real_rank mine = cairn_bench::plan_for_real(comm, g);
    auto all = comm.gather(cairn_bench::encode_real(mine), 0);
    if (comm.rank() == 0) {
      std::vector<cairn_bench::real_rank> figures;
      for (const auto& b : all) figures.push_back(cairn_bench::decode_real(b));
      std::printf("%s\n", cairn_bench::real_json(g, figures, "mpi processes").c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn-bench-plan-mpi: %s\n", e.what());
    return 1;
  }
  return 0;
}
