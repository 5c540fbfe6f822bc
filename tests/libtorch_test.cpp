// tests/libtorch_test.cpp: cairn/libtorch.hpp, the umbrella of cairn::torch: the integration
// docs/libtorch.md shows, in small: a train state of a module tree, an AdamW state factory, a
// step and a bare torch::Tensor field, checkpointed every few steps with a checkpointer,
// resumed into a fresh model and optimizer that then train exactly as the original; the saved
// tensors read back as new torch tensors.
#include "cairn/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/libtorch/doctest_after_torch.hpp"

namespace libtorch_umbrella_test {

struct train_state {
  cairn::state_dict model;
  cairn::factory optim;
  torch::Tensor ema;  // a bare tensor field: a leaf keyed by its path
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("model", "optim", "ema", "step");
};

/// A model, its AdamW and the state tree over both, as a trainer holds them.
struct trainer {
  torch::nn::Sequential net{torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2)};
  torch::optim::AdamW opt{net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1)};
  train_state state{cairn::libtorch::module_state(*net),
                    cairn::libtorch::optimizer_state(opt, *net), torch::zeros({2}), 0};

  void step() {
    opt.zero_grad();
    auto x = torch::linspace(-1, 1, 12).reshape({3, 4}) * static_cast<double>(state.step + 1);
    net->forward(x).pow(2).sum().backward();
    opt.step();
    state.ema.mul_(0.9).add_(net->forward(x).mean(0).detach(), 0.1);
    ++state.step;
  }
};

}  // namespace libtorch_umbrella_test

TEST_CASE("a module, its AdamW state and a bare tensor resume through a checkpointer") {
  cairn::single_communicator one;
  cairn::checkpointer ckpt("memory://libtorch_umbrella_test", one,
                           {.name = "step{step:04}", .keep_last = 2});
  torch::manual_seed(7);
  libtorch_umbrella_test::trainer a;
  for (int i = 0; i < 5; ++i) {
    a.step();
    if (a.state.step % 2 == 0) ckpt.save(a.state, {.step = a.state.step});
  }
  CHECK(ckpt.list().value().size() == 2);  // step0002 was retired

  torch::manual_seed(99);  // different initial weights
  libtorch_umbrella_test::trainer b;
  auto* w_before = b.net->parameters()[0].data_ptr();
  auto loaded = ckpt.load_latest(b.state).value();
  REQUIRE(loaded.has_value());
  CHECK(loaded->name == "step0004");
  CHECK(b.state.step == 4);
  CHECK(b.net->parameters()[0].data_ptr() == w_before);  // loaded in place

  // a is one step ahead: rewind it to step 4 from the same checkpoint, then both train alike.
  ckpt.load(a.state, "step0004").value();
  CHECK(torch::equal(a.state.ema, b.state.ema));
  for (int i = 0; i < 2; ++i) {
    a.step();
    b.step();
  }
  auto pa = a.net->parameters(), pb = b.net->parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  CHECK(torch::equal(a.state.ema, b.state.ema));
}

TEST_CASE("saved module tensors read back as new torch tensors, by their keys") {
  torch::manual_seed(1);
  libtorch_umbrella_test::trainer t;
  t.step();
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save(t.state, mem, one);
  auto all = cairn::load_tensors(mem, {"model.2.weight", "ema", "optim.state.0.weight.exp_avg"});
  REQUIRE(all.has_value());
  auto w = cairn::libtorch::to_tensor(all->at("model.2.weight"));
  CHECK(w.sizes() == t.net->parameters()[2].sizes());
  CHECK(torch::equal(w, t.net->parameters()[2]));
  CHECK(torch::equal(cairn::libtorch::to_tensor(all->at("ema")), t.state.ema));
  CHECK(cairn::load_common(mem).value().at("step").as<std::int64_t>() == 1);

  auto missing = cairn::load_tensors(mem, {"model.9.weight"});
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == cairn::errc::not_found);
}
