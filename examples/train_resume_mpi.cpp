// train_resume_mpi: the train_resume example with one process per rank under mpirun.
//
// Each phase is one mpirun; scripts/demo --mpi runs them in order:
//   mpirun -np 4 train_resume_mpi --phase reference   uninterrupted run, final weights saved
//   mpirun -np 4 train_resume_mpi --phase train       saves every few steps, stops part-way
//   mpirun -np 2 train_resume_mpi --phase resume      resumes from the latest checkpoint
//   mpirun -np 3 train_resume_mpi --phase resume
//   train_resume_mpi --phase compare                  prints "resume 4 -> N: match" per resume
// Common flags: [--dir DIR] [--steps N] [--interrupt-at N] [--save-every N]
#include "cairn/comm/mpi.hpp"
#include "tiny_trainer.hpp"

int main(int argc, char** argv) {
  tiny::options o;
  std::vector<std::string> rest;
  if (!tiny::parse(argc, argv, o, rest) || rest.size() != 2 || rest[0] != "--phase") {
    std::fprintf(stderr,
                 "usage: train_resume_mpi --phase reference|train|resume|compare [--dir DIR] "
                 "[--steps N] [--interrupt-at N] [--save-every N]\n");
    return 2;
  }
  const std::string phase = rest[1];
  try {
    if (phase == "compare") {
      bool all = tiny::compare(o, 4, 2);
      all = tiny::compare(o, 4, 3) && all;
      return all ? 0 : 1;
    }
    cairn::mpi_environment env(argc, argv);
    cairn::mpi_communicator comm(MPI_COMM_WORLD);
    std::string label = phase + " on " + std::to_string(comm.size()) + " processes";
    if (phase == "reference") {
      auto fin = o.dir / "final_reference";
      tiny::train(comm, o, o.steps, false, false, &fin, label);
    } else if (phase == "train") {
      tiny::train(comm, o, o.interrupt_at, true, false, nullptr, label);
    } else if (phase == "resume") {
      auto fin = o.dir / ("final_resume_" + std::to_string(comm.size()));
      tiny::train(comm, o, o.steps, false, true, &fin, label);
    } else {
      std::fprintf(stderr, "unknown phase %s\n", phase.c_str());
      return 2;
    }
    return 0;
  } catch (const cairn::exception& e) {
    std::fprintf(stderr, "train_resume_mpi: %s\n", e.what());
    return 1;
  }
}
