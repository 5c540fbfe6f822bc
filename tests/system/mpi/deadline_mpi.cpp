// Collective deadlines under mpirun: a process that stalls before the save, inside its write,
// or before a load makes every other process fail within the deadline (plus a short grace),
// with an error naming it; the stalled process fails as soon as it comes back; the previous
// checkpoint still loads.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "cairn/comm/mpi.hpp"
#include "cairn/load.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/decorator.hpp"
#include "tests/support/row_block.hpp"
#include "tests/support/test_util.hpp"

using namespace cairn_test;
using namespace std::chrono_literals;

namespace {

/// A [32 * world, 64] f32 weight in row blocks.
struct deadline_state : row_block {
  deadline_state(int rank, int world, float base) : row_block(rank, world, base, 32, 64) {}
};

/// Holds this process's writers for `stall` before opening them: a slow disk.
class slow_storage : public cairn::storage_decorator<cairn::file_storage> {
 public:
  using decorator = cairn::storage_decorator<cairn::file_storage>;
  slow_storage(cairn::file_storage& f, std::chrono::milliseconds stall)
      : decorator(f), stall_(stall) {}
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    std::this_thread::sleep_for(stall_);
    return decorator::open_writer(name);
  }

 private:
  std::chrono::milliseconds stall_;
};

constexpr auto test_deadline = 1000ms;

/// Runs `f(comm, stalled)` with a communicator of `test_deadline` over the world; checks that
/// every process but the last failed with errc::comm naming the last one within twice the
/// deadline (plus the grace to collect reports), and that the last one failed too.
template <class F>
void stalled_last(const char* phase, F&& f) {
  cairn::mpi_communicator comm(MPI_COMM_WORLD, test_deadline);
  const int rank = comm.rank(), world = comm.size();
  const bool stalled = rank == world - 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = f(comm, stalled);
  const auto waited = std::chrono::steady_clock::now() - t0;
  INFO(std::string(phase));
  REQUIRE(!r);
  INFO(r.err().describe());
  CHECK(r.err().code == cairn::errc::comm);
  if (!stalled) {
    CHECK(names_missing(r.err().describe(), world - 1));
    CHECK(waited < 2 * test_deadline + 2s);
  } else {
    CHECK(r.err().describe().find("this rank came late") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("MPI deadlines: a stalled process fails every process, naming it; the last save loads") {
  cairn::mpi_communicator world_comm(MPI_COMM_WORLD);
  if (world_comm.size() < 2) return;  // nobody to wait for
  const int rank = world_comm.rank(), world = world_comm.size();
  const std::string dir = shared_temp_dir(world_comm);
  cairn::file_storage disk(dir);
  cairn::save_options so;
  so.overwrite = true;
  {
    deadline_state first(rank, world, 1.0f);
    cairn::save(first.sd, disk, world_comm, so);
  }

  // Plan: the last process stalls before it enters the save.
  stalled_last("plan", [&](cairn::mpi_communicator& comm, bool stalled) {
    deadline_state s(rank, world, 2.0f);
    if (stalled) std::this_thread::sleep_for(5 * test_deadline / 2);
    return cairn::try_save(s.sd, disk, comm, so);
  });
  world_comm.barrier();

  // Write: the last process's disk stalls before its data file opens; the others wait for it in
  // the commit.
  stalled_last("write", [&](cairn::mpi_communicator& comm, bool stalled) {
    deadline_state s(rank, world, 3.0f);
    slow_storage slow(disk, stalled ? 5 * test_deadline / 2 : 0ms);
    return cairn::try_save(s.sd, slow, comm, so);
  });
  world_comm.barrier();

  // Load: the last process stalls before it enters the load.
  stalled_last("load", [&](cairn::mpi_communicator& comm, bool stalled) {
    deadline_state s(rank, world, 0.0f);
    if (stalled) std::this_thread::sleep_for(5 * test_deadline / 2);
    return cairn::try_load(s.sd, disk, comm);
  });
  world_comm.barrier();

  // Nothing of the failed saves was committed: the first checkpoint loads whole.
  CHECK(loads_rows(disk, world_comm, 1.0f, 32, 64));
  world_comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("MPI deadlines: a deadline of zero waits as long as it takes; negative is refused") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD, 0ms);
  CHECK(comm.deadline() == 0ms);
  if (comm.rank() == comm.size() - 1) std::this_thread::sleep_for(100ms);
  const std::byte mine{static_cast<unsigned char>(comm.rank())};
  auto all = comm.all_gather(std::span(&mine, 1));
  CHECK(all.size() == static_cast<std::size_t>(comm.size()));
  CHECK_THROWS_AS(cairn::mpi_communicator(MPI_COMM_WORLD, -1ms), cairn::exception);
  CHECK(cairn::mpi_communicator(MPI_COMM_WORLD).deadline() == cairn::default_collective_deadline);
}
