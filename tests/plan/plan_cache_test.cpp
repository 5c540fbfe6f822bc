// Plan caching: an unchanged structure reuses the plan and exchanges only hashes.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <vector>

#include "tests/support/counting_comm.hpp"
#include "tests/support/test_util.hpp"

TEST_CASE("a second save with the same structure reuses the plan, exchanging a small vote") {
  constexpr int world = 4;
  cairn::memory_storage mem;
  // Per rank, per step: the collectives of that step's save.
  std::vector<std::vector<std::vector<cairn_test::collective_use>>> logs(world);
  std::vector<std::vector<bool>> reused(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    cairn::save_plan_cache cache;
    std::vector<float> w(64 * 64);
    std::vector<std::int32_t> big(4096);
    cairn::state_dict sd;
    for (int i = 0; i < 20; ++i)
      sd.add("w" + std::to_string(i),
             cairn::from_rank_offsets("w" + std::to_string(i), std::span(w).first(16 * 64),
                                      {16, 64}, {{0, tc.rank(), world}}));
    sd.add("big", cairn::replicated("big", std::span(big), {4096}, tc.rank()));
    for (int step = 0; step < 4; ++step) {
      auto& log = logs[tc.rank()].emplace_back();
      cairn_test::counting_comm comm{tc, &log};
      sd.add("step", std::int64_t{step});  // common values may change: the plan does not
      std::fill(w.begin(), w.end(), static_cast<float>(step));
      cairn::save_options o;
      o.overwrite = true;
      o.plan_cache = &cache;
      o.scalable_planning = false;                    // this test follows the all-gather path
      if (step == 3) sd.add("new", std::int64_t{1});  // structure changed: plan again
      auto stats = cairn::save(sd, mem, comm, o);
      reused[tc.rank()].push_back(stats.plan_reused);
    }
    CHECK(cache.hits() == 2);
    CHECK(cache.misses() == 2);
  });
  CHECK(reused[0] == std::vector<bool>{false, true, true, false});
  for (int r = 1; r < world; ++r) CHECK(reused[r] == reused[0]);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    // A miss all-gathers every rank's description: every leaf, more than a kilobyte.
    REQUIRE(!logs[r][0].empty());
    CHECK(logs[r][0][0].kind == "all_gather");
    CHECK(logs[r][0][0].received > 1000);
    // A hit: the vote goes to rank 0 (gather) and the verdict comes back (broadcast). Every
    // rank but the root sends and receives at most 64 bytes for it.
    for (int step : {1, 2}) {
      const auto& log = logs[r][step];
      REQUIRE(log.size() >= 2);
      CHECK(log[0].kind == "gather");
      CHECK(log[1].kind == "broadcast");
      if (r != 0) {
        CHECK(log[0].sent + log[1].received <= 64);
        CHECK(log[0].received + log[1].sent == 0);
      }
    }
    // A changed structure: the vote fails, then the full exchange.
    REQUIRE(logs[r][3].size() >= 3);
    CHECK(logs[r][3][0].kind == "gather");
    CHECK(logs[r][3][2].kind == "all_gather");
    CHECK(logs[r][3][2].received > 1000);
  }
  // and the checkpoint is right
  auto t = cairn::load_tensors(mem, {"w0"}).value();
  CHECK(t.at("w0").as<float>()[0] == 3.0f);
  CHECK(cairn::load_common(mem).value().at("new").as<std::int64_t>() == 1);
}

TEST_CASE("a cached plan still catches common values that differ across ranks") {
  cairn::memory_storage mem;
  std::vector<std::string> errors(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::save_plan_cache cache;
    cairn::state_dict sd;
    sd.add("step", std::int64_t{1});
    cairn::save_options o;
    o.overwrite = true;
    o.plan_cache = &cache;
    cairn::save(sd, mem, comm, o);
    sd.add("step", std::int64_t{2 + comm.rank()});
    auto r = cairn::try_save(sd, mem, comm, o);
    errors[comm.rank()] = r ? "" : r.err().describe();
  });
  CHECK(errors[0].find("common value differs") != std::string::npos);
  CHECK(errors[1] == errors[0]);
}

TEST_CASE("a cached plan serves only the settings it was made with") {
  cairn::plan_settings made;
  made.block_size = 64;
  made.balance_min_bytes = 32;
  made.tile = true;
  made.scalable = false;
  made.index_files = true;
  made.strategy = &made;
  made.validated = true;
  CHECK(made.serves(made));
  cairn::plan_settings unvalidated_save = made;
  unvalidated_save.validated = false;
  CHECK(made.serves(unvalidated_save));        // a checked plan serves a save that skips checks
  CHECK_FALSE(unvalidated_save.serves(made));  // but an unchecked plan never a checked save
  auto differs = [&](auto change) {
    cairn::plan_settings want = made;
    change(want);
    return !made.serves(want);
  };
  CHECK(differs([](cairn::plan_settings& s) { s.block_size = 128; }));
  CHECK(differs([](cairn::plan_settings& s) { s.balance_min_bytes = 0; }));
  CHECK(differs([](cairn::plan_settings& s) { s.tile = false; }));
  CHECK(differs([](cairn::plan_settings& s) { s.scalable = true; }));
  CHECK(differs([](cairn::plan_settings& s) { s.index_files = false; }));
  CHECK(differs([](cairn::plan_settings& s) { s.strategy = nullptr; }));
}
