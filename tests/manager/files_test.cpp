// save_stats::files: every rank reports the objects it wrote (Composer's list of saved files),
// for synchronous and async saves, in every layout; together they are the checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"

TEST_CASE("every rank reports the files it wrote; together they are the checkpoint") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::convert::output_format::one_file);
  const std::pair<const char*, const cairn::save_strategy*> strategies[] = {
      {"native", nullptr}, {"torch_dist", &torch_dist}, {"one_file", &one_file}};
  for (auto [name, strategy] : strategies) {
    for (bool async : {false, true}) {
      const std::string layout = name;
      CAPTURE(layout);
      CAPTURE(async);
      cairn::memory_storage mem;
      std::mutex mu;
      std::vector<std::vector<std::string>> files(3);
      cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
        std::vector<float> w(8 * 4, static_cast<float>(comm.rank()));
        std::vector<std::int64_t> ids(6, 1);
        cairn::state_dict sd;
        sd.add("w", cairn::from_rank_offsets("w", std::span(w), {8, 4}, {{0, comm.rank(), 3}}));
        sd.add("ids", cairn::replicated("ids", std::span(ids), {6}, comm.rank()));
        if (strategy != &one_file) sd.add("step", std::int64_t{4});  // safetensors: tensors only
        cairn::save_options so;
        so.strategy = strategy;
        cairn::save_stats stats;
        if (async) {
          cairn::async_saver saver;
          saver.save(sd, mem, comm, so).value();
          stats = saver.finalize().value();
        } else {
          stats = cairn::save(sd, mem, comm, so);
        }
        std::lock_guard lock(mu);
        files[static_cast<std::size_t>(comm.rank())] = stats.files;
      });
      std::set<std::string> reported;
      for (const auto& f : files) reported.insert(f.begin(), f.end());
      const auto stored = mem.list("").value();
      std::string got, want;
      for (const auto& f : reported) got += f + " ";
      for (const auto& f : stored) want += f + " ";
      CAPTURE(got);
      CAPTURE(want);
      CHECK(reported == std::set<std::string>(stored.begin(), stored.end()));
      // Rank 0 commits: the metadata is the last object it wrote.
      REQUIRE(!files[0].empty());
      if (strategy == nullptr) CHECK(files[0].back() == "metadata.json");
      if (strategy == &torch_dist) CHECK(files[0].back() == ".metadata");
    }
  }
}
