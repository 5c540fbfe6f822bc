// The checkpoint manager under mpirun: processes save through one checkpointer each (async, with
// retention), `latest` names the last committed checkpoint, every process resumes from it (on
// the whole world and alone), a name that differs between processes writes nothing, and a
// stale pointer is resolved by one listing on rank 0.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "tests/api/test_util.hpp"

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
