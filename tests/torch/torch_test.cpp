// cairn::torch on thread ranks: every libtorch 1.13 dtype, non-contiguous and expanded tensors,
// bare tensors in structs, module trees, optimizer trees (Adam, AdamW, SGD, RMSprop, Adagrad),
// and N -> M resharding of a tensor-parallel module, its AdamW state and a distributed
// optimizer's flat slices.
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/libtorch.hpp"
#include "tests/torch/doctest_after_torch.hpp"
#include "tests/torch/tp_model.hpp"

namespace lt = cairn::libtorch;
using namespace cairn_test;

namespace {

cairn::single_communicator solo;

/// `t` as real numbers (its real view when complex), for comparisons.
torch::Tensor view_real(const torch::Tensor& t) {
  return t.is_complex() ? torch::view_as_real(t) : t;
}

/// `t` saved alone as key "t" and loaded into `into`; returns the load's error, if any.
cairn::result<void> round_trip(const torch::Tensor& t, torch::Tensor into) {
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("t", lt::tensor(t));
  auto saved = cairn::try_save(sd, mem, solo);
  if (!saved) return std::move(saved).err();
  cairn::state_dict back;
  back.add("t", lt::tensor(std::move(into)));
  auto loaded = cairn::try_load(back, mem, solo);
  if (!loaded) return std::move(loaded).err();
  return cairn::ok();
}

}  // namespace

TEST_CASE("every libtorch dtype saves and loads in place, complex as its real view") {
  torch::manual_seed(7);
  const c10::ScalarType types[] = {torch::kBool,         torch::kUInt8,       torch::kInt8,
                                   torch::kInt16,        torch::kInt32,       torch::kInt64,
                                   torch::kFloat16,      torch::kBFloat16,    torch::kFloat32,
                                   torch::kFloat64,      torch::kComplexHalf, torch::kComplexFloat,
                                   torch::kComplexDouble};
  for (auto type : types) {
    INFO(c10::toString(type));
    torch::Tensor src = (torch::randn({5, 3}, torch::kDouble) * 50).to(type);
    if (type == torch::kComplexHalf)  // randn has no ComplexHalf kernel: build it from floats
      src = torch::complex(torch::randn({5, 3}), torch::randn({5, 3})).to(type);
    torch::Tensor dst = torch::zeros({5, 3}, src.options());
    auto r = round_trip(src, dst);
    REQUIRE_MESSAGE(r, (r ? std::string() : r.err().describe()));
    CHECK(torch::equal(view_real(dst), view_real(src)));
    if (!src.is_complex()) {
      auto dt = lt::to_dtype(type);
      REQUIRE(dt);
      CHECK(lt::to_scalar_type(*dt) == type);
    }
  }
  // The stored dtype of a complex tensor is its parts', with a trailing axis of 2.
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("z", lt::tensor(torch::zeros({4}, torch::kComplexFloat)));
  cairn::save(sd, mem, solo);
  auto all = cairn::load_tensors(mem).value();
  CHECK(all.at("z").type == cairn::dtype::f32);
  CHECK(all.at("z").global_shape == cairn::shape{4, 2});
  // dtypes libtorch 1.13 lacks have no scalar type.
  for (auto t : {cairn::dtype::u16, cairn::dtype::u32, cairn::dtype::u64, cairn::dtype::f8_e4m3,
                 cairn::dtype::f8_e5m2})
    CHECK_FALSE(lt::to_scalar_type(t));
}

TEST_CASE("to_tensor: whole tensors from load_tensors as new torch tensors") {
  cairn::memory_storage mem;
  cairn::state_dict sd;
  torch::Tensor w = torch::randn({3, 5}, torch::kFloat64);
  torch::Tensor ids = torch::arange(7, torch::kInt16);
  sd.add("w", lt::tensor(w));
  sd.add("ids", lt::tensor(ids));
  std::vector<std::uint16_t> u16(4, 9);
  sd.add("u16", cairn::from_rank_offsets("u16", std::span(u16), {4}, {}));
  cairn::save(sd, mem, solo);
  auto all = cairn::load_tensors(mem).value();
  CHECK(torch::equal(lt::to_tensor(all.at("w")), w));
  CHECK(torch::equal(lt::to_tensor(all.at("ids")), ids));
  CHECK_THROWS_WITH_AS(lt::to_tensor(all.at("u16")), doctest::Contains("U16"), cairn::exception);
  cairn::tensor_data bad = all.at("w");
  bad.data.pop_back();
  CHECK_THROWS_AS(lt::to_tensor(bad), cairn::exception);
}

TEST_CASE("quantized, undefined and mismatched tensors are refused with the key named") {
  auto q = torch::quantize_per_tensor(torch::rand({4}), 0.1, 0, torch::kQUInt8);
  auto r = round_trip(q, torch::zeros({4}));
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("quantized") != std::string::npos);

  cairn::memory_storage mem;
  cairn::state_dict undefined;
  undefined.add("w", lt::tensor(torch::Tensor{}));
  auto u = cairn::try_save(undefined, mem, solo);
  REQUIRE_FALSE(u);
  CHECK(u.err().message.find("undefined") != std::string::npos);

  // Shape and dtype mismatches on load come from cairn's checks, naming the key.
  auto shape = round_trip(torch::ones({4, 2}), torch::zeros({2, 4}));
  REQUIRE_FALSE(shape);
  CHECK(shape.err().describe().find("t") != std::string::npos);
  auto type = round_trip(torch::ones({4}), torch::zeros({4}, torch::kInt32));
  REQUIRE_FALSE(type);
  CHECK(type.err().code == cairn::errc::mismatch);
}

TEST_CASE("non-contiguous tensors: saved as their values, loaded through a copy") {
  torch::Tensor base = torch::arange(24, torch::kFloat).reshape({4, 6});
  torch::Tensor transposed = base.t();  // 6 x 4, strides (1, 6)
  torch::Tensor dst_base = torch::zeros({4, 6});
  torch::Tensor dst = dst_base.t();
  REQUIRE(round_trip(transposed, dst));
  CHECK(torch::equal(dst, transposed));
  CHECK(torch::equal(dst_base, base));  // written through the view into its base

  // A strided slice of a larger tensor, loaded into another slice: the rest stays untouched.
  torch::Tensor big = torch::full({4, 8}, -1.0);
  torch::Tensor cols = big.narrow(1, 2, 3);
  REQUIRE(round_trip(base.narrow(1, 0, 3), cols));
  CHECK(torch::equal(cols, base.narrow(1, 0, 3)));
  CHECK(torch::equal(big.narrow(1, 0, 2), torch::full({4, 2}, -1.0)));
  CHECK(torch::equal(big.narrow(1, 5, 3), torch::full({4, 3}, -1.0)));

  // Expanded tensors save (their values), but cannot be loaded into.
  torch::Tensor row = torch::arange(3, torch::kFloat);
  torch::Tensor expanded = row.expand({4, 3});
  torch::Tensor plain = torch::zeros({4, 3});
  REQUIRE(round_trip(expanded, plain));
  CHECK(torch::equal(plain, expanded));
  auto r = round_trip(plain, torch::zeros({3}).expand({4, 3}));
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("share memory") != std::string::npos);
}

namespace {
struct trainer_state {
  torch::Tensor weights;
  std::map<std::string, torch::Tensor> buffers;
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("weights", "buffers", "step");
};
}  // namespace

TEST_CASE("bare torch::Tensor fields and map values are leaves keyed by their path") {
  trainer_state s{torch::randn({3, 4}), {{"a", torch::arange(5)}, {"b", torch::ones({2})}}, 9};
  cairn::memory_storage mem;
  cairn::save(s, mem, solo);
  auto all = cairn::load_tensors(mem).value();
  CHECK(all.count("weights") == 1);
  CHECK(all.count("buffers.a") == 1);
  CHECK(all.at("buffers.a").type == cairn::dtype::i64);

  trainer_state back{
      torch::zeros({3, 4}), {{"a", torch::zeros({5}, torch::kLong)}, {"b", torch::zeros({2})}}, 0};
  cairn::load(back, mem, solo);
  CHECK(torch::equal(back.weights, s.weights));
  CHECK(torch::equal(back.buffers["a"], s.buffers["a"]));
  CHECK(back.step == 9);
}

TEST_CASE("a module is a tree of its parameters and buffers, loaded in place") {
  torch::manual_seed(1);
  tp_block m(1);
  fill(m, 0, 1, 3.0);
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("model", lt::module_state(*m));
  cairn::save(sd, mem, solo);
  auto all = cairn::load_tensors(mem).value();
  std::vector<std::string> keys;
  for (auto& [k, v] : all) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"model.ln.bias", "model.ln.weight", "model.pos",
                                         "model.proj.bias", "model.proj.weight", "model.qkv.bias",
                                         "model.qkv.weight"});

  tp_block fresh(1);
  auto* weight_before = fresh->qkv->weight.data_ptr();
  auto version_before = fresh->qkv->weight._version();
  cairn::state_dict back;
  back.add("model", lt::module_state(*fresh));
  cairn::load(back, mem, solo);
  CHECK(mismatches(fresh, 0, 1, 3.0).empty());
  CHECK(fresh->qkv->weight.data_ptr() == weight_before);  // in place
  CHECK(fresh->qkv->weight._version() > version_before);  // autograd sees the write

  // skip(): left out of the tree.
  lt::sharding no_pos;
  no_pos.skip("pos");
  cairn::memory_storage mem2;
  cairn::state_dict sd2;
  sd2.add("model", lt::module_state(*m, no_pos));
  cairn::save(sd2, mem2, solo);
  CHECK(cairn::load_tensors(mem2).value().count("model.pos") == 0);
}

TEST_CASE("name patterns: * spans dots, ? one character, first rule wins") {
  CHECK(lt::name_matches("*.attn.*", "layers.3.attn.qkv.weight"));
  CHECK(lt::name_matches("layers.?.mlp.*", "layers.7.mlp.fc.bias"));
  CHECK_FALSE(lt::name_matches("layers.?.mlp.*", "layers.17.mlp.fc.bias"));
  CHECK(lt::name_matches("*", ""));
  CHECK_FALSE(lt::name_matches("a*b", "acbd"));
  lt::sharding s(5);
  s.split("*.weight", 0, 1, 2, 0).replicate("*", 3);
  CHECK(s.place("x.weight").splits.size() == 1);
  CHECK(s.place("x.weight").replica_id == 0);
  CHECK(s.place("x.bias").replica_id == 3);
  CHECK(lt::sharding(5).place("x").replica_id == 5);
}

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
      *ref->state()[c10::guts::to_string(whole.unsafeGetTensorImpl())]);
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
            *opt->state()[c10::guts::to_string(slice.unsafeGetTensorImpl())]);
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

TEST_CASE("SGD, RMSprop and Adagrad state round-trips; a second step matches the first run's") {
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
