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
