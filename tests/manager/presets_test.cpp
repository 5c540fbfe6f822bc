// Load presets (everything, model and optimizer, model only, fine-tune) and client state (the
// common values a tree does not declare, returned by load).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"

namespace {

/// A trainer's state with every part: model, optimizer, scheduler, counters. Values from `gen`.
struct trainer {
  std::vector<float> w, m;
  cairn::state_dict sd;
  cairn::common_value* last_epoch = nullptr;
  cairn::common_value* step = nullptr;
  /// `replica`: this rank's replica id when several ranks save it.
  explicit trainer(int gen, int replica = 0)
      : w(8, static_cast<float>(gen)), m(8, static_cast<float>(gen) * 10) {
    sd.child("model").add("w", cairn::replicated("model.w", std::span(w), {8}, replica));
    sd.child("optim").add("m", cairn::replicated("optim.m", std::span(m), {8}, replica));
    last_epoch = &sd.child("sched").add("last_epoch", std::int64_t{gen * 100});
    step = &sd.add("step", std::int64_t{gen * 1000});
  }
  /// Which parts hold generation `gen`: "model", "optim", "sched", "step".
  std::vector<std::string> parts_of(int gen) const {
    std::vector<std::string> out;
    if (w[0] == static_cast<float>(gen)) out.push_back("model");
    if (m[0] == static_cast<float>(gen) * 10) out.push_back("optim");
    if (last_epoch->as<std::int64_t>() == gen * 100) out.push_back("sched");
    if (step->as<std::int64_t>() == gen * 1000) out.push_back("step");
    return out;
  }
};

}  // namespace

TEST_CASE("load presets select the parts of the state they name") {
  cairn::memory_storage mem;
  cairn::single_communicator one;
  {
    trainer saved(1);
    cairn::save(saved.sd, mem, one);
  }
  const std::pair<cairn::load_preset, std::vector<std::string>> cases[] = {
      {cairn::load_preset::everything, {"model", "optim", "sched", "step"}},
      {cairn::load_preset::model_and_optimizer, {"model", "optim"}},
      {cairn::load_preset::model_only, {"model"}},
      {cairn::load_preset::fine_tune, {"model"}}};
  for (const auto& [preset, loaded] : cases) {
    CAPTURE(static_cast<int>(preset));
    for (auto strict : {cairn::strict_mode::assume_ok_unexpected, cairn::strict_mode::raise_all}) {
      trainer t(0);
      cairn::load_options lo;
      lo.strict = strict;
      CHECK(cairn::try_load(t.sd, mem, one, cairn::with_preset(preset, lo)));
      CHECK(t.parts_of(1) == loaded);
      // What was not loaded keeps the tree's values (a fine-tune starts its counters at zero).
      std::vector<std::string> kept;
      for (const char* p : {"model", "optim", "sched", "step"})
        if (std::find(loaded.begin(), loaded.end(), p) == loaded.end()) kept.push_back(p);
      CHECK(t.parts_of(0) == kept);
    }
  }
  // Other prefixes, and an edit_keys of the caller's that runs first.
  trainer t(0);
  cairn::load_options lo;
  lo.edit_keys = [](std::vector<std::string>& keys) { std::erase(keys, std::string("optim.m")); };
  cairn::state_parts parts;
  parts.model = {"sched."};
  parts.optimizer = {"optim."};
  CHECK(cairn::try_load(t.sd, mem, one,
                        cairn::with_preset(cairn::load_preset::model_and_optimizer, lo, parts)));
  CHECK(t.parts_of(1) == std::vector<std::string>{"sched"});
}

TEST_CASE("client state: common values the tree does not declare come back from load") {
  cairn::memory_storage mem;
  cairn::single_communicator one;
  {
    trainer saved(2);
    saved.sd.child("client").add("note", std::string("from the old trainer"));
    saved.sd.child("client").add("tokens_seen", std::int64_t{123456});
    cairn::save(saved.sd, mem, one);
  }
  trainer t(0);
  std::map<std::string, cairn::common_value> client;
  client["stale"] = cairn::common_value::of(std::int64_t{1});  // cleared by the load
  cairn::load_options lo;
  lo.client_state = &client;
  REQUIRE(cairn::try_load(t.sd, mem, one, lo));
  CHECK(t.parts_of(2) == std::vector<std::string>{"model", "optim", "sched", "step"});
  REQUIRE(client.size() == 2);
  CHECK(client.at("client.note").as<std::string>() == "from the old trainer");
  CHECK(client.at("client.tokens_seen").as<std::int64_t>() == 123456);
  // A preset that leaves the counters out returns them too: a fine-tune can read the old step.
  trainer u(0);
  lo = cairn::with_preset(cairn::load_preset::fine_tune, lo);
  REQUIRE(cairn::try_load(u.sd, mem, one, lo));
  CHECK(u.parts_of(2) == std::vector<std::string>{"model"});
  CHECK(client.size() == 4);
  CHECK(client.at("step").as<std::int64_t>() == 2000);
  CHECK(client.at("sched.last_epoch").as<std::int64_t>() == 200);
}

TEST_CASE("client objects: sharded objects the tree does not load come back as their bytes") {
  cairn::memory_storage mem;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    trainer saved(3, comm.rank());
    const std::byte r{static_cast<unsigned char>(comm.rank())};
    saved.sd.add("rng", cairn::per_rank("rng", cairn::bytes{r, std::byte{7}}, comm.rank(), 2));
    saved.sd.child("client").add(
        "loader", cairn::per_rank("loader.state", cairn::bytes{std::byte{9}, r}, comm.rank(), 2));
    cairn::save(saved.sd, mem, comm);
  });
  cairn::single_communicator one;
  using bytes = cairn::bytes;
  const bytes rng0{std::byte{0}, std::byte{7}}, rng1{std::byte{1}, std::byte{7}};
  const bytes loader0{std::byte{9}, std::byte{0}}, loader1{std::byte{9}, std::byte{1}};
  // A tree that declares no objects: every one comes back, by unique key.
  trainer t(0);
  std::map<std::string, bytes> objects;
  objects["stale"] = bytes{std::byte{1}};  // cleared by the load
  cairn::load_options lo;
  lo.client_objects = &objects;
  REQUIRE(cairn::try_load(t.sd, mem, one, lo));
  CHECK(t.parts_of(3) == std::vector<std::string>{"model", "optim", "sched", "step"});
  CHECK(objects == std::map<std::string, bytes>{{"loader.state/shard_1_2", loader1},
                                                {"loader.state/shard_0_2", loader0},
                                                {"rng/shard_0_2", rng0},
                                                {"rng/shard_1_2", rng1}});
  // A tree that loads `rng` (rank 1 of 2): only the loader's come back.
  trainer u(0);
  u.sd.add("rng", cairn::per_rank("rng", bytes(2), 1, 2));
  REQUIRE(cairn::try_load(u.sd, mem, one, lo));
  CHECK(std::get<cairn::byte_object>(*u.sd.find("rng")).value == rng1);
  CHECK(objects == std::map<std::string, bytes>{{"loader.state/shard_0_2", loader0},
                                                {"loader.state/shard_1_2", loader1}});
  // Left out by ignore_keys: returned, and the tree keeps its value.
  trainer v(0);
  v.sd.add("rng", cairn::per_rank("rng", bytes(2), 0, 2));
  lo.ignore_keys = {"rng"};
  REQUIRE(cairn::try_load(v.sd, mem, one, lo));
  CHECK(std::get<cairn::byte_object>(*v.sd.find("rng")).value == bytes(2));
  CHECK(objects.size() == 4);
  CHECK(objects.at("rng/shard_0_2") == rng0);
}
