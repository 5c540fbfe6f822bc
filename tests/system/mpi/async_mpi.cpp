// async_saver under mpirun: a save returns after staging and commits from the background
// thread (loadable before wait()); a storage failure in one process's background write reaches
// every process, and the previous checkpoint stays loadable.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "cairn/async/saver.hpp"
#include "cairn/comm/mpi.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "tests/support/gated_storage.hpp"
#include "tests/support/row_block.hpp"
#include "tests/support/test_util.hpp"

using namespace cairn_test;

namespace {

/// A [64 * world, 300] f32 weight in row blocks.
struct state : row_block {
  state(int rank, int world, float base) : row_block(rank, world, base, 64, 300) {}
};

/// Whether the checkpoint in `st` loads as the state of `base`.
bool loads_state(cairn::storage_ref st, cairn::comm_ref comm, float base) {
  return loads_rows(st, comm, base, 64, 300);
}

}  // namespace

TEST_CASE("async save under MPI: background failures reach every process") {
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
  CHECK(loads_state(disk, comm, 1.0f));
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("async save under MPI: committed from the background thread, loadable before wait") {
  // mpi_main's mpi_environment asked for MPI_THREAD_MULTIPLE; Open MPI provides it.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  REQUIRE(level == MPI_THREAD_MULTIPLE);
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  std::string dir = shared_temp_dir(comm);
  cairn::file_storage disk(dir);
  cairn::save_options so;
  so.overwrite = true;

  cairn::async_saver saver;
  state s(rank, world, 5.0f);
  auto h = saver.save(s.sd, disk, comm, so);
  REQUIRE(h);
  CHECK(saver.commits_in_background());
  // No call into cairn on this thread until the save is settled: the background thread
  // commits on its own duplicate of the communicator.
  REQUIRE(poll_until([&] { return h->done(); }));
  // Loadable now, on the training thread's communicator, before wait().
  CHECK(loads_state(disk, comm, 5.0f));
  REQUIRE(h->wait());

  // Destroyed without finalize(): the next save is committed all the same.
  {
    cairn::async_saver other;
    state s2(rank, world, 6.0f);
    REQUIRE(other.save(s2.sd, disk, comm, so));
  }
  CHECK(loads_state(disk, comm, 6.0f));
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

namespace {

using gated_disk = cairn_test::gated_storage<cairn::file_storage>;

}  // namespace

TEST_CASE("async save under MPI: staged bytes changed before the write fail every process") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  std::string dir = shared_temp_dir(comm);
  cairn::file_storage disk(dir);
  cairn::save_options so;
  so.overwrite = true;
  state first(rank, world, 1.0f);
  cairn::save(first.sd, disk, comm, so);

  gated_disk gated(disk);
  cairn::async_saver saver;
  state s(rank, world, 2.0f);
  auto h = saver.save(s.sd, gated, comm, so);
  REQUIRE(h);
  // This process's background writer has taken its checksums and waits on the storage.
  while (gated.arrived.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  comm.barrier();
  if (rank == 0) saver.pool().buffer()[5] ^= std::byte{0x10};  // a stray write into the pool
  gated.open();
  auto r = h->wait();
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().rank == 0);
  CHECK(r.err().key == "w");

  CHECK(loads_state(disk, comm, 1.0f));  // nothing of the failed save committed
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
