// The checkpoint manager under mpirun: processes save through one checkpointer each (async, with
// retention), `latest` names the last committed checkpoint, every process resumes from it (on
// the whole world and alone), a name that differs between processes writes nothing, and a
// stale pointer is resolved by one listing on rank 0; load presets, client state, the files each
// process reports and progress reports, across processes.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "tests/support/test_util.hpp"

using namespace cairn_test;

namespace {

/// A [16 * world, 8] f32 weight in row blocks over `world` processes, values from the step.
struct weights {
  std::vector<float> w;
  cairn::state_dict sd;
  weights(int rank, int world, int rows_world, std::int64_t step) {
    const std::int64_t rows = 16 * rows_world, n = rows / world;
    w.resize(static_cast<std::size_t>(n * 8));
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(step * 10000 + rank * n * 8 + static_cast<std::int64_t>(i));
    sd.add("w", cairn::block("w", std::span(w), {n, 8}, {rows, 8}, {rank * n, 0}));
    sd.add("step", step);
  }
};

}  // namespace

TEST_CASE("checkpointer under MPI: async saves, retention, resume on the world and alone") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  const std::string dir = shared_temp_dir(comm);
  cairn::file_storage root(dir);
  {
    cairn::checkpointer ckpt(root, comm, {.keep_last = 2, .async = true});
    for (std::int64_t step : {10, 20, 30}) {
      weights s(rank, world, world, step);
      auto r = ckpt.try_save(s.sd, {.step = step});
      REQUIRE(r);
      CHECK(!r->previous_failure);
    }
    auto last = ckpt.finalize();
    REQUIRE(last);
    REQUIRE(*last);
    CHECK((*last)->deleted == std::vector<std::string>{"step00000010"});
  }
  CHECK(read_text(root, "latest") == "step00000030\n");
  {
    cairn::checkpointer ckpt(root, comm);
    weights s(rank, world, world, 0);
    auto r = ckpt.load_latest(s.sd);
    REQUIRE(r);
    REQUIRE(*r);
    CHECK((*r)->counters.step == 30);
    weights want(rank, world, world, 30);
    CHECK(s.w == want.w);
  }
  {
    // Each process alone (a world of one) loads the whole tensor, all at once.
    cairn::single_communicator one;
    cairn::checkpointer ckpt(root, one);
    weights s(0, 1, world, 0);
    auto r = ckpt.load(s.sd, "step00000020");
    REQUIRE(r);
    weights want(0, 1, world, 20);
    CHECK(s.w == want.w);
  }
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("checkpointer under MPI: differing names write nothing, a stale pointer is scanned") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  const std::string dir = shared_temp_dir(comm);
  cairn::file_storage root(dir);
  cairn::checkpointer ckpt(root, comm);
  weights s(rank, world, world, 5);
  if (world > 1) {
    auto bad = ckpt.try_save(s.sd, {.step = rank == world - 1 ? 6 : 5});
    REQUIRE(!bad);
    CHECK(bad.err().code == cairn::errc::invalid_argument);
    CHECK(bad.err().message.find("step00000006") != std::string::npos);
    comm.barrier();
    CHECK(root.list("").value().empty());
  }
  REQUIRE(ckpt.try_save(s.sd, {.step = 5}));
  weights t(rank, world, world, 7);
  REQUIRE(ckpt.try_save(t.sd, {.step = 7}));
  comm.barrier();
  if (rank == 0) {
    const std::string stale = "step00000009\n";  // a save killed before its commit
    REQUIRE(root.put("step00000009/data.0.0123456789ab.cairn", std::as_bytes(std::span(stale))));
    REQUIRE(root.put("latest", std::as_bytes(std::span(stale))));
  }
  comm.barrier();
  weights back(rank, world, world, 0);
  auto r = ckpt.load_latest(back.sd);
  REQUIRE(r);
  REQUIRE(*r);
  CHECK((*r)->name == "step00000007");
  CHECK((*r)->found_by_scan);
  CHECK(back.w == t.w);
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

namespace {

/// A trainer's state in parts, rows in blocks over the processes: `model.w`, `optim.m`,
/// `sched.last_epoch`, `step`; values from the generation `gen`.
struct trainer {
  std::vector<float> w, m;
  cairn::state_dict sd;
  trainer(int rank, int world, int gen) {
    const std::int64_t rows = 4 * world;
    w.assign(4 * 16, static_cast<float>(gen));
    m.assign(4 * 16, static_cast<float>(gen) * 10);
    sd.child("model").add("w", cairn::block("model.w", std::span(w), {4, 16}, {rows, 16},
                                            {rank * std::int64_t{4}, 0}));
    sd.child("optim").add("m", cairn::block("optim.m", std::span(m), {4, 16}, {rows, 16},
                                            {rank * std::int64_t{4}, 0}));
    sd.child("sched").add("last_epoch", std::int64_t{gen * 100});
    sd.add("step", std::int64_t{gen * 1000});
  }
};

/// Whether every report of a stage ended at its total (last report per stage).
struct stage_ends {
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> last;
  bool monotone = true;
  cairn::progress_callback callback() {
    return [this](const cairn::progress_report& p) {
      auto it = last.find(std::string(p.stage));
      if (it != last.end() && p.done < it->second.first) monotone = false;
      last[std::string(p.stage)] = {p.done, p.total};
    };
  }
};

}  // namespace

TEST_CASE("checkpointer under MPI: presets, client state and objects, files reported, progress") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  const std::string dir = shared_temp_dir(comm);
  cairn::file_storage root(dir);
  stage_ends saving;
  std::vector<std::string> files;
  {
    cairn::checkpointer_options opt;
    opt.save.progress = saving.callback();
    cairn::checkpointer ckpt(root, comm, opt);
    trainer t(rank, world, 1);
    t.sd.add("data_seed", std::int64_t{1234});  // not declared by the trees that load
    const auto mine = static_cast<unsigned char>(rank);
    t.sd.add("rng", cairn::per_rank("rng", cairn::bytes{std::byte{mine}}, rank, world));
    auto r = ckpt.try_save(t.sd, {.step = 1000});
    REQUIRE(r);
    REQUIRE(r->committed);
    files = r->committed->stats.files;
  }
  // Progress: this process's share of the data, to its end.
  REQUIRE(saving.last.count("write"));
  CHECK(saving.monotone);
  CHECK(saving.last["write"].first == saving.last["write"].second);
  CHECK(saving.last["write"].second == 2 * 4 * 16 * sizeof(float) + 1);  // and its RNG state
  // Files: every process reports its data file; together they are the checkpoint.
  std::string mine;
  for (const auto& f : files) mine += f + "\n";
  std::set<std::string> reported;
  for (const auto& b : comm.all_gather(std::as_bytes(std::span(mine)))) {
    std::string text(reinterpret_cast<const char*>(b.data()), b.size());
    for (std::size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
      reported.insert(text.substr(at, nl - at));
  }
  CHECK(std::any_of(files.begin(), files.end(), [&](const std::string& f) {
    return f.starts_with("data." + std::to_string(rank) + ".");
  }));
  if (rank == 0) CHECK(files.back() == "metadata.json");
  const auto listed = root.list("step00001000/").value();
  std::set<std::string> stored;
  for (const auto& n : listed) stored.insert(n.substr(std::string("step00001000/").size()));
  CHECK(reported == stored);
  // Presets and client state: each process loads its rows, model only, and gets back the common
  // values its tree left out.
  {
    cairn::checkpointer ckpt(root, comm);
    trainer t(rank, world, 0);
    std::map<std::string, cairn::common_value> client;
    std::map<std::string, cairn::bytes> objects;
    stage_ends loading;
    cairn::load_options lo;
    lo.client_state = &client;
    lo.client_objects = &objects;
    lo.strict = cairn::strict_mode::raise_all;
    lo.progress = loading.callback();
    auto r = ckpt.load_latest(t.sd, cairn::with_preset(cairn::load_preset::model_only, lo));
    REQUIRE(r);
    REQUIRE(*r);
    CHECK((*r)->counters.step == 1000);
    CHECK(t.w == std::vector<float>(4 * 16, 1.0f));
    CHECK(t.m == std::vector<float>(4 * 16, 0.0f));  // the optimizer keeps its values
    REQUIRE(client.count("data_seed"));
    CHECK(client.at("data_seed").as<std::int64_t>() == 1234);
    REQUIRE(client.count("sched.last_epoch"));  // left out by the preset: returned
    CHECK(client.at("sched.last_epoch").as<std::int64_t>() == 100);
    CHECK(client.at("step").as<std::int64_t>() == 1000);
    // Every process's RNG state, on every process.
    REQUIRE(objects.size() == static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
      CHECK(objects.at("rng/shard_" + std::to_string(r) + "_" + std::to_string(world)) ==
            cairn::bytes{std::byte{static_cast<unsigned char>(r)}});
    REQUIRE(loading.last.count("read"));
    CHECK(loading.monotone);
    CHECK(loading.last["read"].first == loading.last["read"].second);
    CHECK(loading.last["read"].second >= 4 * 16 * sizeof(float));
  }
  {
    // Everything, on the whole world: both parts and the scheduler.
    cairn::checkpointer ckpt(root, comm);
    trainer t(rank, world, 0);
    auto r = ckpt.load_latest(t.sd, cairn::with_preset(cairn::load_preset::everything, {}));
    REQUIRE(r);
    CHECK(t.m == std::vector<float>(4 * 16, 10.0f));
  }
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
