// load_plan_cache (pipeline/load_cache.hpp): a load of the same format version 4 checkpoint
// asking for the same boxes reads no index file again; another checkpoint or other boxes read
// it; the checkpointer reuses by default.
#include "cairn/pipeline/load_cache.hpp"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "tests/support/test_util.hpp"

namespace load_cache_test {

/// "w" f32 [8, 4] in row blocks over `world` ranks, values `base` + element index.
struct rows_state {
  std::vector<float> w;
  cairn::state_dict sd;
  rows_state(int rank, int world, float base, bool fill) {
    const std::int64_t n = 8 / world;
    w.assign(static_cast<std::size_t>(n * 4), -1.0f);
    if (fill)
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = base + static_cast<float>(rank * n * 4) + static_cast<float>(i);
    sd.add("w", cairn::block("w", std::span(w), {n, 4}, {8, 4}, {rank * n, 0}));
  }
};

}  // namespace load_cache_test

TEST_CASE("a repeated load of the same checkpoint and boxes reads no index file again") {
  cairn::memory_storage mem;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    load_cache_test::rows_state s(comm.rank(), 2, 100, true);
    cairn::save(s.sd, mem, comm);  // format version 4: chunks in index files
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::load_plan_cache cache;
    load_cache_test::rows_state want(comm.rank(), 2, 100, true);
    for (int round = 0; round < 3; ++round) {
      load_cache_test::rows_state s(comm.rank(), 2, 0, false);
      auto stats = cairn::load(s.sd, mem, comm, {.plan_cache = &cache});
      CHECK(s.w == want.w);
      CHECK(stats.index_reused == (round > 0));
      CHECK((stats.index_bytes_read > 0) == (round == 0));
    }
    CHECK(cache.hits() == 2);
    CHECK(cache.misses() == 1);
    // Other boxes (one rank loading everything) read the index.
    cairn::single_communicator one;
    load_cache_test::rows_state whole(0, 1, 0, false);
    auto stats = cairn::load(whole.sd, mem, one, {.plan_cache = &cache});
    CHECK(!stats.index_reused);
    CHECK(stats.index_bytes_read > 0);
    CHECK(whole.w == load_cache_test::rows_state(0, 1, 100, true).w);
  });
  // The checkpoint written again (a new save id) is read again, and loads its new values.
  std::vector<cairn::load_plan_cache> caches(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    load_cache_test::rows_state s(comm.rank(), 2, 0, false);
    cairn::load(s.sd, mem, comm, {.plan_cache = &caches[static_cast<std::size_t>(comm.rank())]});
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    load_cache_test::rows_state s(comm.rank(), 2, 500, true);
    cairn::save(s.sd, mem, comm, {.overwrite = true});
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    load_cache_test::rows_state s(comm.rank(), 2, 0, false);
    auto stats = cairn::load(s.sd, mem, comm,
                             {.plan_cache = &caches[static_cast<std::size_t>(comm.rank())]});
    CHECK(!stats.index_reused);
    CHECK(s.w == load_cache_test::rows_state(comm.rank(), 2, 500, true).w);
  });
}

TEST_CASE("the checkpointer reuses the index of the checkpoint it loaded before") {
  cairn::memory_storage root;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::checkpointer ckpt(root, comm);
    load_cache_test::rows_state s(comm.rank(), 2, 7, true);
    ckpt.save(s.sd, {.step = 1});
    for (int round = 0; round < 2; ++round) {
      load_cache_test::rows_state got(comm.rank(), 2, 0, false);
      auto r = ckpt.load_latest(got.sd).value();
      REQUIRE(r);
      CHECK(got.w == s.w);
      CHECK(r->stats.index_reused == (round == 1));
    }
  });
}
