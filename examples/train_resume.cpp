// train_resume: a reference integration of cairn in a (tiny) tensor-parallel trainer, on
// in-process thread ranks (train_resume_mpi is the same under mpirun).
//
// The model (tiny_trainer.hpp) trains on 4 ranks and saves every few steps into
// DIR/step_NNNNNN through a cairn::checkpointer (async, keeping the last two, DIR/latest naming
// the newest committed); the run is interrupted part-way with a save in flight (which commits in
// the background as the checkpointers close), resumes with
// load_latest on 2 ranks and on 3 ranks (uneven row blocks), finishes, and compares the final
// weights with an uninterrupted 4-rank run. It prints one line per resume: "resume 4 -> 2: match"
// (or MISMATCH and exits 1).
//
//   train_resume [--dir DIR] [--steps N] [--interrupt-at N] [--save-every N]
#include "tiny_trainer.hpp"

int main(int argc, char** argv) {
  tiny::options o;
  std::vector<std::string> rest;
  if (!tiny::parse(argc, argv, o, rest) || !rest.empty()) {
    std::fprintf(stderr,
                 "usage: train_resume [--dir DIR] [--steps N] [--interrupt-at N] "
                 "[--save-every N]\n");
    return 2;
  }
  try {
    std::printf("training a %lldx%lld tensor-parallel model with Adam; checkpoints in %s\n",
                static_cast<long long>(tiny::rows), static_cast<long long>(tiny::cols),
                o.dir.c_str());
    auto on_ranks = [&](int world, auto&& body) {
      cairn::run_ranks(world, [&](cairn::thread_communicator& comm) { body(comm); });
    };
    auto ref = o.dir / "final_reference";
    on_ranks(4,
             [&](auto& c) { tiny::train(c, o, o.steps, false, false, &ref, "reference 4 ranks"); });
    on_ranks(4, [&](auto& c) {
      tiny::train(c, o, o.interrupt_at, true, false, nullptr, "train 4 ranks");
    });
    std::printf(
        "interrupted at step %lld with the last save in flight: it committed in the background "
        "as the checkpointers closed; latest names %s\n",
        static_cast<long long>(o.interrupt_at), tiny::latest_checkpoint(o).c_str());
    bool all = true;
    for (int world : {2, 3}) {
      auto fin = o.dir / ("final_resume_" + std::to_string(world));
      std::string label = "resume on " + std::to_string(world) + " ranks";
      on_ranks(world, [&](auto& c) { tiny::train(c, o, o.steps, false, true, &fin, label); });
      all = tiny::compare(o, 4, world) && all;
    }
    return all ? 0 : 1;
  } catch (const cairn::exception& e) {
    std::fprintf(stderr, "train_resume: %s\n", e.what());
    return 1;
  }
}
