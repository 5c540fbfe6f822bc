// async_saver under mpirun: a save returns after staging and commits at wait(); a storage
// failure in one process's background write reaches every process, and the previous
// checkpoint stays loadable.
#include <doctest/doctest.h>

#include <filesystem>

#include "cairn/async/saver.hpp"
#include "cairn/comm/mpi.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "tests/support/test_util.hpp"

using namespace cairn_test;

namespace {

/// A [64 * world, 300] f32 weight split in row blocks; values from the global index.
struct state {
  std::vector<float> w;
  cairn::state_dict sd;
  state(int rank, int world, float base) : w(64 * 300) {
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = base + static_cast<float>(static_cast<std::size_t>(rank) * w.size() + i);
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {64, 300}, {{0, rank, world}}));
  }
};

}  // namespace

TEST_CASE("async save under MPI: commit at wait, background failures reach every process") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  std::string dir = shared_temp_dir(comm);
  cairn::file_storage disk(dir);
  cairn::save_options so;
  so.overwrite = true;
  so.block_size = 8 << 10;

  cairn::async_saver saver;
  state s(rank, world, 1.0f);
  auto h = saver.save(s.sd, disk, comm, so);
  REQUIRE(h);
  std::fill(s.w.begin(), s.w.end(), -1.0f);  // after staging: must not reach the checkpoint
  REQUIRE(h->wait());

  // The last process's disk fails on its first write; the others write fine.
  cairn::faulty_storage<cairn::file_storage> faulty(disk);
  if (rank == world - 1) faulty.fail_after_writes(0);
  state s2(rank, world, 2.0f);
  auto h2 = saver.save(s2.sd, faulty, comm, so);
  REQUIRE(h2);
  auto r = h2->wait();
  REQUIRE(!r);
  CHECK(r.err().describe().find("injected failure") != std::string::npos);
  CHECK(r.err().rank == world - 1);

  // The first checkpoint is still the committed one.
  state back(rank, world, 0.0f);
  std::fill(back.w.begin(), back.w.end(), 0.0f);
  cairn::load(back.sd, disk, comm);
  state want(rank, world, 1.0f);
  CHECK(back.w == want.w);
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
