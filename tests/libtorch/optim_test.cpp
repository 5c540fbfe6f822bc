// cairn::torch on thread ranks: every libtorch 1.13 dtype, non-contiguous and expanded tensors,
// bare tensors in structs, module trees, optimizer trees (Adam, AdamW, SGD, RMSprop, Adagrad),
// N -> M resharding of a tensor-parallel module, its AdamW state and a distributed optimizer's
// flat slices, a mixed-precision optimizer's fp32 masters (and their unshard), and pipeline
// stages' Adam state loaded across stage counts.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/masters.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/libtorch.hpp"
#include "tests/libtorch/doctest_after_torch.hpp"
#include "tests/libtorch/round_trip.hpp"
#include "tests/libtorch/tp_model.hpp"
#include "tests/support/test_util.hpp"

namespace lt = cairn::libtorch;
using namespace cairn_test;

TEST_CASE("a tensor-parallel module and its AdamW state saved on N thread ranks load on M") {
  // The reference: one rank holding the whole block, one AdamW step.
  tp_block ref(1);
  fill(ref, 0, 1, 1.0);
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
  adamw_step(ref, ref_opt, 0, 1, 1.0);
  for (int n : {1, 2, 3, 4}) {
    for (int m : {1, 2, 3, 4}) {
      INFO("N=" << n << " M=" << m);
      cairn::memory_storage mem;
      cairn::run_ranks(n, [&](cairn::thread_communicator& comm) {
        tp_block b(n);
        fill(b, comm.rank(), n, 1.0);
        torch::optim::AdamW opt(b->parameters(), torch::optim::AdamWOptions(1e-2));
        adamw_step(b, opt, comm.rank(), n, 1.0);
        cairn::save(tp_state(b, opt, comm.rank(), n), mem, comm);
      });
      std::vector<std::vector<std::string>> bad(static_cast<std::size_t>(m));
      cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
        tp_block b(m);  // fresh: default init, no optimizer state
        torch::optim::AdamW opt(b->parameters(), torch::optim::AdamWOptions(0.5));
        auto sd = tp_state(b, opt, comm.rank(), m);
        cairn::load(sd, mem, comm);
        auto& out = bad[static_cast<std::size_t>(comm.rank())];
        out = loaded_mismatches(b, opt, ref, ref_opt, comm.rank(), m);
        if (opt.param_groups()[0].options().get_lr() != 1e-2) out.push_back("lr");
      });
      for (auto& r : bad) CHECK(r.empty());
    }
  }
}

TEST_CASE("a distributed optimizer's flat slices saved on N thread ranks load on M") {
  // One global parameter of 6 x 4; each data-parallel rank updates a contiguous slice of it.
  torch::Tensor global = torch::arange(24, torch::kFloat).reshape({6, 4}) * 0.1;
  torch::Tensor grad = torch::arange(24, torch::kFloat).reshape({6, 4}) * -0.05 + 0.3;
  auto range = [](int r, int n) {
    return cairn::flat_range{24 * r / n, 24 * (r + 1) / n};  // uneven for n = 5
  };
  auto slice_opt = [&](torch::Tensor slice) {
    return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{slice},
                                                torch::optim::AdamOptions(1e-3).amsgrad(true));
  };
  // Reference state: the whole parameter in one Adam.
  torch::Tensor whole = global.clone();
  auto ref = slice_opt(whole);
  whole.mutable_grad() = grad.clone();
  ref->step();
  auto& rs = static_cast<torch::optim::AdamParamState&>(
      *ref->state()[cairn::libtorch::optimizer_state_key(whole)]);
  for (int n : {1, 2, 5}) {
    for (int m : {1, 3, 4}) {
      INFO("N=" << n << " M=" << m);
      cairn::memory_storage mem;
      cairn::run_ranks(n, [&](cairn::thread_communicator& comm) {
        auto [b, e] = range(comm.rank(), n);
        torch::Tensor slice = global.flatten().narrow(0, b, e - b).clone();
        auto opt = slice_opt(slice);
        slice.mutable_grad() = grad.flatten().narrow(0, b, e - b).clone();
        opt->step();
        lt::placement place{.block_shape = cairn::shape{6, 4}, .flat = cairn::flat_range{b, e}};
        cairn::state_dict sd;
        sd.add("optim", lt::optimizer_state(*opt, {{"w", slice, place}}));
        cairn::save(sd, mem, comm);
      });
      std::vector<int> bad(static_cast<std::size_t>(m));
      cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
        auto [b, e] = range(comm.rank(), m);
        torch::Tensor slice = torch::zeros({e - b});
        auto opt = slice_opt(slice);
        lt::placement place{.block_shape = cairn::shape{6, 4}, .flat = cairn::flat_range{b, e}};
        cairn::state_dict sd;
        sd.add("optim", lt::optimizer_state(*opt, {{"w", slice, place}}));
        cairn::load(sd, mem, comm);
        auto& s = static_cast<torch::optim::AdamParamState&>(
            *opt->state()[cairn::libtorch::optimizer_state_key(slice)]);
        auto want = [&](const torch::Tensor& t) { return t.flatten().narrow(0, b, e - b); };
        bool ok = s.step() == 1 && torch::allclose(s.exp_avg(), want(rs.exp_avg()), 1e-6, 1e-9) &&
                  torch::allclose(s.exp_avg_sq(), want(rs.exp_avg_sq()), 1e-6, 1e-9) &&
                  torch::allclose(s.max_exp_avg_sq(), want(rs.max_exp_avg_sq()), 1e-6, 1e-9);
        bad[static_cast<std::size_t>(comm.rank())] = ok ? 0 : 1;
      });
      for (int r : bad) CHECK(r == 0);
    }
  }
}

TEST_CASE(
    "a mixed-precision optimizer's fp32 masters save with it, load on M, unshard to the model") {
  // A bf16 model whose distributed optimizer keeps fp32 masters: values bf16 cannot hold.
  torch::Tensor masters = torch::arange(24, torch::kFloat).reshape({6, 4}) * 0.1 + 1.0 / 3;
  torch::Tensor model = masters.to(torch::kBFloat16);
  auto range = [](int r, int n) { return cairn::flat_range{24 * r / n, 24 * (r + 1) / n}; };
  auto state = [&](torch::Tensor w, torch::Tensor slice, torch::optim::Adam& opt, int r, int n) {
    auto [b, e] = range(r, n);
    lt::placement place{.block_shape = cairn::shape{6, 4}, .flat = cairn::flat_range{b, e}};
    cairn::state_dict sd, m;
    m.add("w", lt::tensor(std::move(w), lt::placement{.replica_id = r}));
    sd.add("model", std::move(m));
    sd.add("optim", lt::optimizer_state(opt, {{"w", std::move(slice), place}}, {.masters = true}));
    return sd;
  };
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt");
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    auto [b, e] = range(comm.rank(), 2);
    torch::Tensor slice = masters.flatten().narrow(0, b, e - b).clone();
    torch::optim::Adam opt(std::vector<torch::Tensor>{slice}, torch::optim::AdamOptions(1e-3));
    cairn::save(state(model.clone(), slice, opt, comm.rank(), 2), ck, comm);
  });
  for (int m : {1, 3}) {
    INFO("M=" << m);
    std::vector<int> bad(static_cast<std::size_t>(m));
    cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
      auto [b, e] = range(comm.rank(), m);
      torch::Tensor slice = torch::zeros({e - b});
      torch::Tensor w = torch::zeros({6, 4}, torch::kBFloat16);
      torch::optim::Adam opt(std::vector<torch::Tensor>{slice}, torch::optim::AdamOptions(1e-3));
      auto sd = state(w, slice, opt, comm.rank(), m);
      cairn::load(sd, ck, comm);
      bool ok =
          torch::equal(slice, masters.flatten().narrow(0, b, e - b)) && torch::equal(w, model);
      bad[static_cast<std::size_t>(comm.rank())] = ok ? 0 : 1;
    });
    for (int r : bad) CHECK(r == 0);
  }
  // `unshard --fp32-masters`: the masters under the model's key, bit for bit.
  auto src = cairn::convert::open_source(ck).value();
  auto whole =
      cairn::convert::consolidate(
          *cairn::convert::select_keys(*src, cairn::convert::fp32_masters(*src).value()).value())
          .value();
  REQUIRE(whole.size() == 1);
  REQUIRE(whole.count("model.w"));
  CHECK(whole["model.w"].type == cairn::dtype::f32);
  CHECK(std::memcmp(whole["model.w"].data.data(), masters.data_ptr<float>(), 24 * 4) == 0);
  // Masters must be F32.
  torch::Tensor half = torch::zeros({4}, torch::kBFloat16);
  torch::optim::Adam bopt(std::vector<torch::Tensor>{half}, torch::optim::AdamOptions(1e-3));
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("optim", lt::optimizer_state(bopt, {{"w", half, {}}}, {.masters = true}));
  auto r = cairn::try_save(sd, mem, solo);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("masters must be F32; the parameter 'w' is BFloat16") !=
        std::string::npos);
}

TEST_CASE("pipeline stages' Adam state (steps held by each stage) loads across stage counts") {
  // Four layers; a pipeline of `pp` stages gives stage s layers [s * 4 / pp, (s + 1) * 4 / pp),
  // each stage its own Adam, replicated over `dp` data-parallel ranks (rank = s * dp + replica).
  // Each parameter's step is then a common value only its stage's ranks declare.
  constexpr int layers = 4;
  auto weight = [](int l) {
    return torch::arange(6, torch::kFloat).reshape({2, 3}) * 0.1 * (l + 1);
  };
  auto grad = [](int l) { return torch::arange(6, torch::kFloat).reshape({2, 3}) * -0.02 + l; };
  struct stage_state {
    std::vector<torch::Tensor> params;
    std::vector<lt::named_tensor> named;
    std::unique_ptr<torch::optim::Adam> opt;
  };
  auto make_stage = [&](int rank, int pp, int dp, bool stepped) {
    stage_state st;
    const int stage = rank / dp;
    for (int l = stage * layers / pp; l < (stage + 1) * layers / pp; ++l) {
      torch::Tensor p = stepped ? weight(l) : torch::zeros({2, 3});
      st.params.push_back(p);
      st.named.push_back(
          {"layers." + std::to_string(l) + ".weight", p, lt::placement{.replica_id = rank % dp}});
    }
    st.opt = std::make_unique<torch::optim::Adam>(st.params,
                                                  torch::optim::AdamOptions(stepped ? 1e-2 : 0.5));
    if (stepped) {
      for (std::size_t i = 0; i < st.params.size(); ++i)
        st.params[i].mutable_grad() = grad(stage * layers / pp + static_cast<int>(i));
      st.opt->step();
    }
    return st;
  };
  // The reference: all layers in one Adam, one step.
  stage_state ref = make_stage(0, 1, 1, true);
  auto ref_state = [&](int l) -> torch::optim::AdamParamState& {
    return static_cast<torch::optim::AdamParamState&>(
        *ref.opt->state()[cairn::libtorch::optimizer_state_key(
            ref.params[static_cast<std::size_t>(l)])]);
  };
  struct layout {
    int pp, dp;
  };
  for (layout saved : {layout{2, 1}, layout{2, 2}, layout{4, 1}, layout{1, 2}}) {
    for (layout loaded : {layout{1, 1}, layout{2, 1}, layout{4, 1}, layout{2, 2}}) {
      INFO("saved pp " << saved.pp << " dp " << saved.dp << ", loaded pp " << loaded.pp << " dp "
                       << loaded.dp);
      cairn::memory_storage mem;
      cairn::run_ranks(saved.pp * saved.dp, [&](cairn::thread_communicator& comm) {
        stage_state st = make_stage(comm.rank(), saved.pp, saved.dp, true);
        cairn::state_dict sd;
        sd.add("optim", lt::optimizer_state(*st.opt, st.named));
        cairn::save(sd, mem, comm);
      });
      std::vector<int> bad(static_cast<std::size_t>(loaded.pp * loaded.dp));
      cairn::run_ranks(loaded.pp * loaded.dp, [&](cairn::thread_communicator& comm) {
        stage_state st = make_stage(comm.rank(), loaded.pp, loaded.dp, false);
        cairn::state_dict sd;
        sd.add("optim", lt::optimizer_state(*st.opt, st.named));
        cairn::load(sd, mem, comm, {.strict = cairn::strict_mode::raise_all});
        const int first = comm.rank() / loaded.dp * layers / loaded.pp;
        for (std::size_t i = 0; i < st.params.size(); ++i) {
          auto& s = static_cast<torch::optim::AdamParamState&>(
              *st.opt->state()[cairn::libtorch::optimizer_state_key(st.params[i])]);
          auto& r = ref_state(first + static_cast<int>(i));
          if (s.step() != 1 || !torch::equal(s.exp_avg(), r.exp_avg()) ||
              !torch::equal(s.exp_avg_sq(), r.exp_avg_sq()))
            ++bad[static_cast<std::size_t>(comm.rank())];
        }
        if (st.opt->param_groups()[0].options().get_lr() != 1e-2)
          ++bad[static_cast<std::size_t>(comm.rank())];
      });
      for (int b : bad) CHECK(b == 0);
    }
  }
}

TEST_CASE("SGD, RMSprop and Adagrad state round-trips, a second step matches the first run's") {
  auto check_kind = [](auto make) {
    torch::manual_seed(3);
    torch::nn::Linear a(4, 3);
    auto opt_a = make(a->parameters());
    auto step = [](torch::nn::Linear& m, auto& opt, double x) {
      opt->zero_grad();
      m->forward(torch::full({2, 4}, x)).pow(2).sum().backward();
      opt->step();
    };
    step(a, opt_a, 1.0);
    step(a, opt_a, 0.5);
    cairn::memory_storage mem;
    cairn::state_dict sd;
    sd.add("model", lt::module_state(*a));
    sd.add("optim", lt::optimizer_state(*opt_a, *a));
    cairn::save(sd, mem, solo);

    torch::nn::Linear b(4, 3);
    auto opt_b = make(b->parameters());
    cairn::state_dict back;
    back.add("model", lt::module_state(*b));
    back.add("optim", lt::optimizer_state(*opt_b, *b));
    cairn::load(back, mem, solo);
    step(a, opt_a, 0.25);
    step(b, opt_b, 0.25);
    CHECK(torch::equal(a->weight, b->weight));
    CHECK(torch::equal(a->bias, b->bias));
  };
  SUBCASE("SGD with momentum and dampening") {
    check_kind([](auto params) {
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1));
    });
  }
  SUBCASE("RMSprop, centered, with momentum") {
    check_kind([](auto params) {
      return std::make_unique<torch::optim::RMSprop>(
          params, torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
    });
  }
  SUBCASE("Adagrad") {
    check_kind([](auto params) {
      return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(0.1));
    });
  }
  SUBCASE("Adam") {
    check_kind([](auto params) {
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(0.01).weight_decay(0.1));
    });
  }
}

TEST_CASE("an optimizer over parameters missing from the names is refused") {
  torch::nn::Linear a(2, 2);
  torch::optim::SGD opt(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("optim", lt::optimizer_state(opt, {{"weight", a->weight, {}}}));  // no bias
  auto r = cairn::try_save(sd, mem, solo);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("not among the named tensors") != std::string::npos);
  torch::optim::LBFGS lbfgs(a->parameters());
  cairn::state_dict sd2;
  sd2.add("optim", lt::optimizer_state(lbfgs, *a));
  auto l = cairn::try_save(sd2, mem, solo);
  REQUIRE_FALSE(l);
  CHECK(l.err().message.find("LBFGS") != std::string::npos);
}
