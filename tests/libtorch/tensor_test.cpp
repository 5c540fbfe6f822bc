// cairn::torch on thread ranks: every libtorch 1.13 dtype, non-contiguous and expanded tensors,
// bare tensors in structs, module trees, optimizer trees (Adam, AdamW, SGD, RMSprop, Adagrad),
// and N -> M resharding of a tensor-parallel module, its AdamW state and a distributed
// optimizer's flat slices.
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/libtorch.hpp"
#include "tests/libtorch/doctest_after_torch.hpp"
#include "tests/libtorch/round_trip.hpp"
#include "tests/libtorch/tp_model.hpp"

namespace lt = cairn::libtorch;
using namespace cairn_test;

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
