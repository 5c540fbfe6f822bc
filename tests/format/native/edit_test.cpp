// remove_sharded_tensors: tensors dropped from a committed checkpoint by rewriting its metadata
// only, in format versions 3 and 4; what is left verifies and loads; other layouts are refused.
#include "cairn/format/native/edit.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"

namespace {

/// Saves model.w, optim.m.w and optim.v.w (each [16, 4] f32 in row blocks) on 2 ranks.
void save_three(cairn::memory_storage& mem, const cairn::save_options& so) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<std::vector<float>> bufs(3, std::vector<float>(8 * 4));
    cairn::state_dict sd;
    const char* keys[] = {"model.w", "optim.m.w", "optim.v.w"};
    for (int k = 0; k < 3; ++k) {
      for (std::size_t i = 0; i < bufs[k].size(); ++i)
        bufs[k][i] = static_cast<float>(k * 100 + comm.rank() * 32 + static_cast<int>(i));
      sd.add(keys[k],
             cairn::from_rank_offsets(keys[k], std::span(bufs[k]), {8, 4}, {{0, comm.rank(), 2}}));
    }
    sd.add("step", std::int64_t{3});
    cairn::save(sd, mem, comm, so);
  });
}

}  // namespace

TEST_CASE("remove_sharded_tensors drops tensors by rewriting the metadata only") {
  for (bool index_files : {true, false}) {
    CAPTURE(index_files);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.index_files = index_files;
    save_three(mem, so);
    auto files_before = mem.list("").value();
    auto removed = cairn::remove_sharded_tensors(mem, "optim.").value();
    CHECK(removed == std::vector<std::string>{"optim.m.w", "optim.v.w"});
    CHECK(mem.list("").value() == files_before);  // no data file touched or removed
    auto m = cairn::read_metadata(mem).value();
    CHECK((m.version == 5) == index_files);
    CHECK(m.tensors.size() == 1);
    CHECK(m.tensors.count("model.w") == 1);
    CHECK(cairn::verify_checkpoint(mem).value().empty());
    auto all = cairn::load_tensors(mem).value();
    REQUIRE(all.size() == 1);
    auto w = all.at("model.w").as<float>();
    REQUIRE(w.size() == 64);
    CHECK(w[0] == 0.0f);
    CHECK(w[63] == 63.0f);
    // A tree with only the model loads under raise_all: nothing missing, nothing unexpected.
    std::vector<float> back(64, -1.0f);
    cairn::state_dict sd;
    sd.add("model.w", cairn::replicated("model.w", std::span(back), {16, 4}, 0));
    sd.add("step", std::int64_t{0});
    cairn::single_communicator one;
    cairn::load_options lo;
    lo.strict = cairn::strict_mode::raise_all;
    CHECK(cairn::try_load(sd, mem, one, lo));
    CHECK(back == std::vector<float>(w.begin(), w.end()));
    // Nothing matches: nothing is written.
    const std::string before = cairn::read_metadata_json(mem).value();
    CHECK(cairn::remove_sharded_tensors(mem, "sched.").value().empty());
    CHECK(cairn::read_metadata_json(mem).value() == before);
    // The last tensor too: an empty checkpoint that still reads and verifies.
    CHECK(cairn::remove_sharded_tensors(mem, "").value() == std::vector<std::string>{"model.w"});
    CHECK(cairn::read_metadata(mem).value().tensors.empty());
    CHECK(cairn::verify_checkpoint(mem).value().empty());
  }
}

TEST_CASE("remove_sharded_tensors refuses other layouts and a missing checkpoint") {
  cairn::memory_storage mem;
  auto none = cairn::remove_sharded_tensors(mem, "x");
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);
  const cairn::torch_dist_strategy torch_dist;
  cairn::save_options so;
  so.strategy = &torch_dist;
  save_three(mem, so);
  auto r = cairn::remove_sharded_tensors(mem, "optim.");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::unsupported_version);
  CHECK(r.err().message.find("torch_dist") != std::string::npos);
  CHECK(cairn::load_tensors(mem).value().size() == 3);  // untouched
}
