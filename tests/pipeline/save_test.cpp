// The phases of a save (pipeline/save.hpp) run by hand below save(): option and name checks,
// the recording storage, the overwrite rule, and plan, write and commit on thread ranks, with a
// failure on one rank reaching every rank and leaving nothing committed.
#include "cairn/pipeline/save.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/counting_comm.hpp"
#include "tests/support/message_check.hpp"
#include "tests/support/pipeline_state.hpp"
#include "tests/support/test_util.hpp"

namespace pipeline_save_test {

/// Rank `r` of 2: rows [2r, 2r + 2) of "w" (f32 [4, 3], value 10 row + col) and a common "step".
struct rank_state {
  std::vector<float> w;
  cairn::state_dict sd;
  explicit rank_state(int r) : w(6) {
    for (int i = 0; i < 6; ++i) w[i] = static_cast<float>(10 * (2 * r + i / 3) + i % 3);
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {{0, r, 2}}));
    sd.add("step", std::int64_t{9});
  }
};

/// Loads "w" whole on one rank.
inline std::vector<float> load_w(cairn::storage_ref st) {
  std::vector<float> w(12, -1.0f);
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4, 3}, {}));
  cairn::single_communicator one;
  cairn::load(sd, st, one);
  return w;
}

}  // namespace pipeline_save_test

TEST_CASE("check_save_options bounds block_size and zstd_level") {
  using cairn::detail::check_save_options;
  CHECK(check_save_options({.block_size = 1}));
  CHECK(check_save_options({.block_size = cairn::max_block_size}));
  for (std::uint64_t b : {std::uint64_t{0}, cairn::max_block_size + 1}) {
    auto r = check_save_options({.block_size = b});
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().message.find("block_size") != std::string::npos);
  }
  CHECK(check_save_options({.zstd_level = 0}));
  CHECK(check_save_options({.zstd_level = 19}));
  for (int z : {-1, 1000}) {
    auto r = check_save_options({.zstd_level = z});
    REQUIRE(!r);
    CHECK(r.err().message.find("zstd_level") != std::string::npos);
  }
}

TEST_CASE("check_utf8_names refuses names that are not UTF-8, naming them") {
  const std::string bad = "w\xff\xfe";
  cairn::leaf_list ok;
  ok.tensors.push_back(cairn::tensor_leaf{.path = "w", .sharding = {.key = "wé"}});
  ok.commons.push_back(cairn::common_leaf{.path = "run/β"});
  CHECK(cairn::detail::check_utf8_names(ok, {}));

  auto expect = [&](const cairn::leaf_list& l, const cairn::save_options& o, const char* what) {
    auto r = cairn::detail::check_utf8_names(l, o);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == bad);
    CHECK(r.err().message.find(what) != std::string::npos);
  };
  cairn::leaf_list t = ok;
  t.tensors[0].sharding.key = bad;
  expect(t, {}, "tensor key");
  cairn::leaf_list o = ok;
  o.objects.push_back(cairn::object_leaf{.key = bad});
  expect(o, {}, "object key");
  cairn::leaf_list c = ok;
  c.commons[0].path = bad;
  expect(c, {}, "common value path");
  expect(ok, {.content_metadata = {{bad, "v"}}}, "content metadata key");
  expect(ok, {.content_metadata = {{"k", bad}}}, "content metadata value");
}

TEST_CASE("strategy_of, effective_options and new_save_id") {
  cairn::torch_dist_strategy td;
  CHECK(cairn::detail::strategy_of({}).name() == "native");
  CHECK(cairn::detail::strategy_of({.strategy = &td}).name() == "torch_dist");
  // index files are the native strategy's; a strategy that does not route them turns them off.
  CHECK(cairn::detail::effective_options({}).index_files);
  CHECK(!cairn::detail::effective_options({.index_files = false}).index_files);
  CHECK(!cairn::detail::effective_options({.strategy = &td}).index_files);

  auto a = cairn::detail::new_save_id(), b = cairn::detail::new_save_id();
  CHECK(a.size() == 12);
  CHECK(std::all_of(a.begin(), a.end(),
                    [](char ch) { return std::isxdigit(ch) && !std::isupper(ch); }));
  CHECK(a != b);
}

TEST_CASE("recording_storage lists the objects written that are still there") {
  cairn::memory_storage mem;
  cairn::faulty_storage faulty{mem};
  cairn::detail::recording_storage rec{faulty};
  const std::byte one[] = {std::byte{1}};
  REQUIRE(rec.put("a", one));
  auto w = rec.open_writer("b").value();
  REQUIRE(w->write_at(0, one));
  CHECK(rec.names() == std::vector<std::string>{"a"});  // not finished: not written yet
  REQUIRE(w->finish());
  REQUIRE(rec.put("c", one));
  REQUIRE(rec.put("a", one));  // written again: listed once, last
  CHECK(rec.names() == std::vector<std::string>{"b", "c", "a"});
  REQUIRE(rec.remove("c"));
  REQUIRE(mem.remove("b"));  // removed by someone else
  CHECK(rec.names() == std::vector<std::string>{"a"});
  faulty.fail_op(0, cairn::fault_mode::fail);
  CHECK(!rec.put("d", one));
  CHECK(rec.names() == std::vector<std::string>{"a"});
  CHECK(rec.describe("a") == mem.describe("a"));
}

TEST_CASE("check_overwrite refuses a committed checkpoint unless asked, and the strategy can") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  CHECK(cairn::detail::check_overwrite(false, mem, {}));
  auto no = cairn::detail::check_overwrite(true, mem, {});
  REQUIRE(!no);
  CHECK(no.err().code == cairn::errc::already_exists);
  CHECK(no.err().file == mem.describe("metadata.json"));
  CHECK(cairn::detail::check_overwrite(true, mem, {.overwrite = true}));
  auto fixed = cairn::detail::check_overwrite(true, mem, {.overwrite = true, .strategy = &td});
  REQUIRE(!fixed);
  CHECK(fixed.err().code == cairn::errc::already_exists);
  CHECK(fixed.err().message.find("torch_dist") != std::string::npos);
}

TEST_CASE("plan, write and commit phases run by hand save what load reads") {
  cairn::memory_storage mem;
  std::vector<std::string> ids(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    pipeline_save_test::rank_state s(comm.rank());
    cairn::leaf_list leaves = cairn::flatten(s.sd);
    cairn::save_options opt;
    cairn::planned_save plan;
    REQUIRE(cairn::detail::plan_phase(leaves, mem, comm, opt, plan));
    ids[comm.rank()] = plan.save_id;
    CHECK(plan.rank == comm.rank());
    CHECK(plan.index.world_size == 2);
    CHECK(plan.items.size() == plan.index.slots[comm.rank()].size());
    std::uint64_t bytes = 0;
    for (const auto& item : plan.items) {
      CHECK(item.key == "w");
      bytes += item.nbytes;
    }
    CHECK(bytes == plan.index.bytes_of_rank[comm.rank()]);
    CHECK(!mem.exists("metadata.json").value());  // planning writes nothing
    cairn::written_save w = cairn::detail::write_phase(plan, mem, opt);
    CHECK(!w.failure);
    auto stats = cairn::detail::commit_phase(plan, w, mem, comm, opt);
    REQUIRE(stats);
    CHECK(stats->save_id == plan.save_id);
  });
  CHECK(ids[0] == ids[1]);
  CHECK(ids[0].size() == 12);
  CHECK(pipeline_save_test::load_w(mem) ==
        std::vector<float>{0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32});

  // Planning again over the committed checkpoint fails on every rank alike.
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    pipeline_save_test::rank_state s(comm.rank());
    cairn::planned_save plan;
    auto r = cairn::detail::plan_phase(cairn::flatten(s.sd), mem, comm, {}, plan);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::already_exists);
  });
}

TEST_CASE("a failure on one rank reaches every rank, naming it, and nothing is committed") {
  SUBCASE("a write fails on rank 1") {
    cairn::memory_storage mem;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      pipeline_save_test::rank_state s(comm.rank());
      cairn::faulty_storage faulty{mem};
      if (comm.rank() == 1) faulty.fail_after_writes(0);
      cairn::planned_save plan;
      REQUIRE(cairn::detail::plan_phase(cairn::flatten(s.sd), faulty, comm, {}, plan));
      cairn::written_save w = cairn::detail::write_phase(plan, faulty, {});
      CHECK(w.failure.has_value() == (comm.rank() == 1));
      if (w.failure) CHECK(w.failure->rank == 1);
      auto r = cairn::detail::commit_phase(plan, w, faulty, comm, {});
      REQUIRE(!r);
      CHECK(r.err().rank == 1);
      CHECK(r.err().code == cairn::errc::io);
    });
    CHECK(cairn::detect_format(mem).value().empty());
    CHECK(mem.list("").value().empty());  // every rank removed what it wrote
  }
  SUBCASE("staging failed on rank 0: planning fails everywhere with its error") {
    cairn::memory_storage mem;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      pipeline_save_test::rank_state s(comm.rank());
      std::optional<cairn::error> local;
      if (comm.rank() == 0)
        local = cairn::make_error(cairn::errc::resource, "staging ran out").with_rank(0);
      cairn::planned_save plan;
      auto r = cairn::detail::plan_phase(cairn::flatten(s.sd), mem, comm, {}, plan, local);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::resource);
      CHECK(r.err().rank == 0);
      CHECK(r.err().message.find("staging ran out") != std::string::npos);
    });
    CHECK(mem.list("").value().empty());
  }
  SUBCASE("a tensor whose bytes are not whole elements") {
    cairn::memory_storage mem;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      pipeline_save_test::rank_state s(comm.rank());
      auto leaves = cairn::flatten(s.sd);
      if (comm.rank() == 1) leaves.tensors[0].nbytes -= 1;
      cairn::planned_save plan;
      auto r = cairn::detail::plan_phase(leaves, mem, comm, {}, plan);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      CHECK(r.err().key == "w");
      CHECK(r.err().rank == 1);
    });
  }
}

TEST_CASE("the plan cache's vote and verdict round-trip and refuse truncation") {
  cairn_test::check_message(cairn::detail::plan_vote_message{0x1234, 0xfeed, {}});
  cairn_test::check_message(
      cairn::detail::plan_vote_message{0x1234, 0xfeed, {{"state.w.step", 42, "42"}}});
  cairn_test::check_message(cairn::detail::plan_verdict_message{true, true, "a1b2c3"});
  cairn::detail::held_commons_message held;
  held.values.emplace_back("state.w.step", cairn::common_value::of(std::int64_t{42}));
  held.values.emplace_back("name", cairn::common_value::of(std::string("adamw")));
  cairn_test::check_message(held);
}

namespace pipeline_save_test {

/// The bytes each of `world` thread ranks receives in one save of 64 weights split by rows
/// over every rank and 64 replicated biases, under `o`.
inline std::vector<std::size_t> received_in_save(int world, const cairn::save_options& o) {
  cairn::memory_storage mem;
  std::vector<std::size_t> received(static_cast<std::size_t>(world));
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    std::vector<cairn_test::collective_use> log;
    cairn_test::counting_comm comm{tc, &log};
    std::vector<float> w(2 * 8, 1.0f), b(8, 2.0f);
    cairn::state_dict sd;
    for (int i = 0; i < 64; ++i) {
      const std::string wk = "layer" + std::to_string(i) + ".weight";
      const std::string bk = "layer" + std::to_string(i) + ".bias";
      sd.add(wk, cairn::from_rank_offsets(wk, std::span(w), {2, 8}, {{0, tc.rank(), world}}));
      sd.add(bk, cairn::replicated(bk, std::span(b), {8}, tc.rank()));
    }
    sd.add("step", std::int64_t{7});
    cairn::save(sd, mem, comm, o);
    received[static_cast<std::size_t>(tc.rank())] = cairn_test::counting_comm::received(log);
  });
  return received;
}

}  // namespace pipeline_save_test

TEST_CASE("plans_by_key_owners: asked, or by default when the world is large enough") {
  cairn::save_options o;
  CHECK(!cairn::detail::plans_by_key_owners(o, 1));
  CHECK(!cairn::detail::plans_by_key_owners(o, cairn::detail::key_owner_planning_min_ranks - 1));
  CHECK(cairn::detail::plans_by_key_owners(o, cairn::detail::key_owner_planning_min_ranks));
  o.scalable_planning = false;
  CHECK(!cairn::detail::plans_by_key_owners(o, 4096));
  o.scalable_planning = true;
  CHECK(cairn::detail::plans_by_key_owners(o, 2));
  const cairn::torch_dist_strategy dcp;  // plans with a whole index only
  cairn::save_options d;
  d.strategy = &dcp;
  CHECK(!cairn::detail::plans_by_key_owners(d, 4096));
  CHECK(cairn::detail::settings_of(o, 2).scalable);
  CHECK(!cairn::detail::settings_of(d, 4096).scalable);
}

TEST_CASE("a default save on 64 ranks: no rank receives every rank's description") {
  constexpr int world = 64;
  cairn::save_options everywhere;
  everywhere.scalable_planning = false;
  const auto all = pipeline_save_test::received_in_save(world, everywhere);
  const auto dflt = pipeline_save_test::received_in_save(world, {});
  std::size_t most = 0, most_everywhere = 0;
  for (int r = 0; r < world; ++r) {
    most = std::max(most, dflt[static_cast<std::size_t>(r)]);
    most_everywhere = std::max(most_everywhere, all[static_cast<std::size_t>(r)]);
  }
  MESSAGE("most bytes a rank received: default " << most << ", all-gather planning "
                                                 << most_everywhere);
  // Every rank's description is about 128 leaves: the all-gather brings 63 of them to each.
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(dflt[static_cast<std::size_t>(r)] * 8 < all[static_cast<std::size_t>(r)]);
  }
}

namespace pipeline_save_test {

using cairn_test::pipeline_layers;
using cairn_test::pipeline_rank;

/// Saves a (pp, dp) pipeline with `base` into `st` (through a plan cache when `cached`, after a
/// save with base - 1 elsewhere made the plan) and returns every rank's plan-cache hits.

inline std::size_t save_pipeline(cairn::storage_ref st,
                                 int pp,
                                 int dp,
                                 std::int64_t base,
                                 const cairn::save_options& so,
                                 bool cached) {
  std::atomic<std::size_t> hits{0};
  cairn::memory_storage scratch;
  cairn::run_ranks(pp * dp, [&](cairn::thread_communicator& comm) {
    cairn::save_plan_cache cache;
    cairn::save_options o = so;
    if (cached) {
      o.plan_cache = &cache;
      pipeline_rank early(comm.rank(), pp, dp, base - 1);
      cairn::save(early.sd, scratch, comm, o);
    }
    pipeline_rank r(comm.rank(), pp, dp, base);
    cairn::save(r.sd, st, comm, o);
    hits += cache.hits();
  });
  return hits;
}

/// Loads a (pp, dp) pipeline from `st` and returns what differs from a save with `base`.
inline std::vector<std::string> load_pipeline(cairn::storage_ref st,
                                              int pp,
                                              int dp,
                                              std::int64_t base) {
  std::mutex m;
  std::vector<std::string> out;
  cairn::run_ranks(pp * dp, [&](cairn::thread_communicator& comm) {
    pipeline_rank r(comm.rank(), pp, dp, base);
    r.scramble();
    cairn::load(r.sd, st, comm, {.strict = cairn::strict_mode::raise_all});
    std::lock_guard lock(m);
    for (auto& d : r.differences(base))
      out.push_back("rank " + std::to_string(comm.rank()) + ": " + d);
  });
  return out;
}

}  // namespace pipeline_save_test

TEST_CASE("common values held by pipeline stages save once and load across pipeline sizes") {
  using namespace pipeline_save_test;
  const cairn::torch_dist_strategy torch_dist;
  struct layout {
    int pp, dp;
  };
  // (2, 1) and (1, 2) plan everywhere, (2, 2) and (4, 1) by key owners (native), each with and
  // without a plan cache; torch_dist plans everywhere at every size.
  for (const cairn::save_strategy* strategy :
       std::initializer_list<const cairn::save_strategy*>{nullptr, &torch_dist}) {
    for (layout saved : {layout{2, 1}, layout{2, 2}, layout{4, 1}, layout{1, 2}}) {
      for (bool cached : {false, true}) {
        cairn::memory_storage mem;
        const std::int64_t base = 1000 + saved.pp * 10 + saved.dp;
        INFO("strategy " << std::string(strategy ? strategy->name() : "native") << ", saved pp "
                         << saved.pp << " dp " << saved.dp
                         << std::string(cached ? ", cached plan" : ""));
        const std::size_t hits =
            save_pipeline(mem, saved.pp, saved.dp, base, {.strategy = strategy}, cached);
        CHECK(hits == (cached ? static_cast<std::size_t>(saved.pp * saved.dp) : 0u));
        // Each step is in the common state once, whichever stage held it.
        auto common = cairn::load_common(mem);
        REQUIRE(common);
        CHECK(common->size() == pipeline_layers + 1);
        for (layout loaded : {layout{1, 1}, layout{2, 1}, layout{1, 3}, layout{4, 1}}) {
          INFO("loaded pp " << loaded.pp << " dp " << loaded.dp);
          CHECK(load_pipeline(mem, loaded.pp, loaded.dp, base) == std::vector<std::string>{});
        }
      }
    }
  }
}

TEST_CASE("ranks of one stage that disagree on a common value fail the save, naming both") {
  using namespace pipeline_save_test;
  for (bool cached : {false, true}) {
    for (int world : {2, 4}) {  // planned everywhere, by key owners
      // Two data-parallel replicas of each stage: 1 stage on 2 ranks, 2 stages on 4 ranks. The
      // last rank's first step is off by one: the value of every rank (2), of stage 1 (4).
      const int pp = world / 2, dp = 2, first = (pipeline_layers / pp) * (pp - 1);
      INFO("world " << world << std::string(cached ? ", cached plan" : ""));
      cairn::memory_storage mem;
      std::vector<std::string> errors(static_cast<std::size_t>(world));
      cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
        cairn::save_plan_cache cache;
        cairn::save_options o{.overwrite = true};
        if (cached) {
          o.plan_cache = &cache;
          pipeline_rank agreed(comm.rank(), pp, dp, 7);
          cairn::save(agreed.sd, mem, comm, o);
        }
        pipeline_rank r(comm.rank(), pp, dp, 8);
        if (comm.rank() == world - 1) r.bump_step(first, 1);
        try {
          cairn::save(r.sd, mem, comm, o);
        } catch (const cairn::exception& e) {
          errors[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      });
      const std::string v = std::to_string(8 + 100 * first);
      for (const auto& e : errors) {
        INFO(e);
        CHECK(e.find("key=" + pipeline_rank::step_key(first)) != std::string::npos);
        CHECK(e.find(v + " on rank " + std::to_string(world - 2) + ", " +
                     v.substr(0, v.size() - 1) + "9 on rank " + std::to_string(world - 1)) !=
              std::string::npos);
      }
      // Nothing of the refused save was committed: the agreed one (or none) is still there.
      if (cached) CHECK(load_pipeline(mem, 1, 1, 7) == std::vector<std::string>{});
      if (!cached) CHECK(cairn::detect_format(mem).value().empty());
    }
  }
}
