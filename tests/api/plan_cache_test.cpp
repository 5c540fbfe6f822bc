// Plan caching: an unchanged structure reuses the plan and exchanges only hashes.
#include <doctest/doctest.h>

#include <atomic>

#include "test_util.hpp"

namespace {

/// Counts the bytes each all_gather sends, around any communicator.
struct counting_comm {
  cairn::thread_communicator inner;
  std::vector<std::size_t>* gathered;  // bytes this rank sent, per all_gather
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
    gathered->push_back(in.size());
    return inner.all_gather(in);
  }
  void broadcast(cairn::bytes& b, int root) { inner.broadcast(b, root); }
  void barrier() { inner.barrier(); }
};
static_assert(cairn::communicator<counting_comm>);

}  // namespace

TEST_CASE("a second save with the same structure reuses the plan") {
  cairn::memory_storage mem;
  std::vector<std::vector<std::size_t>> sent(2);
  std::vector<std::vector<bool>> reused(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& tc) {
    counting_comm comm{tc, &sent[tc.rank()]};
    cairn::save_plan_cache cache;
    std::vector<float> w(64 * 64);
    std::vector<std::int32_t> big(4096);
    cairn::state_dict sd;
    for (int i = 0; i < 20; ++i)
      sd.add("w" + std::to_string(i),
             cairn::from_rank_offsets("w" + std::to_string(i), std::span(w).first(32 * 64),
                                      {32, 64}, {{0, tc.rank(), 2}}));
    sd.add("big", cairn::replicated("big", std::span(big), {4096}, tc.rank()));
    for (int step = 0; step < 4; ++step) {
      sd.add("step", std::int64_t{step});  // common values may change: the plan does not
      std::fill(w.begin(), w.end(), static_cast<float>(step));
      cairn::save_options o;
      o.overwrite = true;
      o.plan_cache = &cache;
      if (step == 3) sd.add("new", std::int64_t{1});  // structure changed: plan again
      auto stats = cairn::save(sd, mem, comm, o);
      reused[tc.rank()].push_back(stats.plan_reused);
    }
    CHECK(cache.hits() == 2);
    CHECK(cache.misses() == 2);
  });
  CHECK(reused[0] == std::vector<bool>{false, true, true, false});
  CHECK(reused[1] == reused[0]);
  // The metadata gather of a miss carries every leaf; a hit sends a few dozen bytes instead.
  // sent: step 0: [desc, status]; step 1: [hash, status]; step 2: same; step 3: [hash, desc,
  // status]
  REQUIRE(sent[0].size() == 9);
  CHECK(sent[0][0] > 1000);
  CHECK(sent[0][2] < 64);
  CHECK(sent[0][4] < 64);
  CHECK(sent[0][6] < 64);
  CHECK(sent[0][7] > 1000);
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
