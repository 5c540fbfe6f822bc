// remove_sharded_tensors: tensors dropped from a committed checkpoint by rewriting its metadata
// only, in format versions 3 and 4; what is left verifies and loads; torch_dist as Megatron
// edits it (.metadata rewritten, unused .distcp files removed); safetensors is refused.
#include "cairn/format/native/edit.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/dcp/metadata.hpp"
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

TEST_CASE("remove_sharded_tensors on torch_dist drops items, and files no longer used") {
  const cairn::torch_dist_strategy torch_dist;
  cairn::save_options so;
  so.strategy = &torch_dist;
  cairn::memory_storage mem;
  // drop.w in row blocks on both ranks; keep.w only on rank 0 (a pipeline stage's tensor).
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> drop(8 * 4), keep(4 * 4);
    for (std::size_t i = 0; i < drop.size(); ++i)
      drop[i] = static_cast<float>(comm.rank() * 32 + static_cast<int>(i));
    for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = 1000.0f + static_cast<float>(i);
    cairn::state_dict sd;
    sd.add("drop.w",
           cairn::from_rank_offsets("drop.w", std::span(drop), {8, 4}, {{0, comm.rank(), 2}}));
    if (comm.rank() == 0)
      sd.add("keep.w", cairn::from_rank_offsets("keep.w", std::span(keep), {4, 4}, {}));
    cairn::save(sd, mem, comm, so);
  });
  auto distcp = [&] {
    std::vector<std::string> out;
    for (const auto& n : mem.list("").value())
      if (n.ends_with(".distcp")) out.push_back(n);
    return out;
  };
  REQUIRE(distcp().size() == 2);
  auto whole = [&](const char* name) {
    std::vector<std::byte> out(mem.size(name).value());
    REQUIRE(mem.read(name, 0, out));
    return out;
  };
  const std::vector<std::byte> metadata_before = whole(".metadata");
  CHECK(cairn::remove_sharded_tensors(mem, "sched.").value().empty());  // nothing: no write
  CHECK(whole(".metadata") == metadata_before);

  CHECK(cairn::remove_sharded_tensors(mem, "drop.").value() == std::vector<std::string>{"drop.w"});
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.format == "torch_dist");
  CHECK(m.tensors.size() == 1);
  CHECK(m.tensors.count("keep.w") == 1);
  CHECK(distcp().size() == 1);  // rank 1's file held drop.w only: removed
  auto md = cairn::dcp::read(mem).value();
  for (const auto& [idx, where] : md.storage_data) CHECK(idx.fqn == "keep.w");
  CHECK(md.class_module == "torch.distributed.checkpoint.metadata");
  auto all = cairn::load_tensors(mem).value();
  REQUIRE(all.size() == 1);
  auto k = all.at("keep.w").as<float>();
  REQUIRE(k.size() == 16);
  CHECK(k[0] == 1000.0f);
  CHECK(k[15] == 1015.0f);
  CHECK(cairn::remove_sharded_tensors(mem, "").value() == std::vector<std::string>{"keep.w"});
  CHECK(distcp().empty());
  CHECK(cairn::read_any_metadata(mem).value().tensors.empty());
}

TEST_CASE("remove_sharded_tensors keeps a torch 1.13 checkpoint in its flavor") {
  const cairn::torch_dist_strategy torch_dist(cairn::dcp::flavor::torch1_13);
  cairn::save_options so;
  so.strategy = &torch_dist;
  cairn::memory_storage mem;
  save_three(mem, so);
  CHECK(cairn::remove_sharded_tensors(mem, "optim.").value().size() == 2);
  CHECK(cairn::dcp::read(mem).value().class_module ==
        "torch.distributed._shard.checkpoint.metadata");
  CHECK(cairn::load_tensors(mem).value().size() == 1);
}

TEST_CASE("remove_sharded_tensors refuses safetensors and a missing checkpoint") {
  cairn::memory_storage mem;
  auto none = cairn::remove_sharded_tensors(mem, "x");
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);
  const cairn::safetensors_strategy one_file;
  cairn::save_options so;
  so.strategy = &one_file;
  cairn::run_ranks(1, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(16, 1.0f);
    cairn::state_dict sd;
    sd.add("optim.w", cairn::from_rank_offsets("optim.w", std::span(w), {4, 4}, {}));
    cairn::save(sd, mem, comm, so);
  });
  auto r = cairn::remove_sharded_tensors(mem, "optim.");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::unsupported_version);
  CHECK(r.err().message.find("safetensors") != std::string::npos);
  CHECK(cairn::load_tensors(mem).value().size() == 1);  // untouched
}
