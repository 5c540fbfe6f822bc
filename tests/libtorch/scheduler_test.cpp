// cairn::libtorch::scheduler_state: a StepLR saved with its optimizer mid-schedule resumes on a
// fresh optimizer and scheduler with the same learning rate at every later step; without the
// scheduler's state the decay would come at the wrong steps.
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/libtorch.hpp"
#include "tests/libtorch/doctest_after_torch.hpp"

namespace lt = cairn::libtorch;

namespace {

/// A one-layer model, its SGD optimizer and a StepLR (step size 3, gamma 0.5).
struct scheduled_run {
  torch::nn::Linear model{4, 2};
  torch::optim::SGD opt{model->parameters(), torch::optim::SGDOptions(0.8)};
  lt::saved_scheduler<torch::optim::StepLR> sched{opt, 3, 0.5};

  double lr() const {
    return static_cast<const torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr();
  }
  /// One training step: a gradient, the optimizer's step, the scheduler's step.
  void step() {
    opt.zero_grad();
    model->forward(torch::ones({1, 4})).sum().backward();
    opt.step();
    sched.step();
  }
  cairn::state_dict tree() {
    cairn::state_dict sd;
    sd.add("model", lt::module_state(*model));
    sd.add("optim", lt::optimizer_state(opt, *model));
    sd.add("sched", lt::scheduler_state(sched));
    return sd;
  }
};

}  // namespace

TEST_CASE("libtorch: a StepLR resumes mid-schedule with its optimizer") {
  scheduled_run a;
  for (int i = 0; i < 7; ++i) a.step();
  CHECK(a.sched.step_count() == 7);
  CHECK(a.lr() == doctest::Approx(0.8 * 0.5 * 0.5));
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save(a.tree(), mem, one);

  scheduled_run b;  // fresh: lr 0.8, step count 0
  auto sd = b.tree();
  cairn::load(sd, mem, one);
  CHECK(b.sched.step_count() == 7);
  CHECK(b.lr() == a.lr());
  std::vector<double> want, got;
  for (int i = 0; i < 6; ++i) {
    a.step();
    b.step();
    want.push_back(a.lr());
    got.push_back(b.lr());
  }
  CHECK(got == want);  // decays after steps 9 and 12, on both
  CHECK(want.back() == doctest::Approx(0.8 * 0.5 * 0.5 * 0.5 * 0.5));

  // Loading the optimizer alone (the scheduler left at 0) would decay at the wrong steps: the
  // test above can fail.
  scheduled_run c;
  cairn::state_dict partial;
  partial.add("model", lt::module_state(*c.model));
  partial.add("optim", lt::optimizer_state(c.opt, *c.model));
  cairn::load_options lo;
  cairn::load(partial, mem, one, lo);
  std::vector<double> drifted;
  for (int i = 0; i < 6; ++i) {
    c.step();
    drifted.push_back(c.lr());
  }
  CHECK(drifted != want);
}

TEST_CASE("libtorch: a saved step count that does not fit is refused naming the key") {
  scheduled_run a;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::state_dict sd;
  sd.add("sched.step_count", std::int64_t{-3});
  cairn::save(sd, mem, one);
  cairn::state_dict back;
  back.add("sched", lt::scheduler_state(a.sched));
  auto r = cairn::try_load(back, mem, one);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::mismatch);
  CHECK(r.err().message.find("step count") != std::string::npos);
}
