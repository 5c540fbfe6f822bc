// Bounded staging under mpirun: every process saves its row block of a tensor in (fake) device
// memory, and a tensor replicated on every process, through a 1 MiB staging window, and loads
// them back into device memory through one; the pinned memory each process used stays within
// its window, and the bytes are exact.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "cairn/cuda/testing/fake_runtime.hpp"
#include "cairn/load.hpp"
#include "cairn/save.hpp"
#include "tests/support/row_block.hpp"
#include "tests/support/test_util.hpp"

using cairn::cuda::testing::fake_runtime;
using namespace cairn_test;

namespace {

constexpr std::int64_t staged_rows = 512, staged_cols = 1024;  // 2 MiB of f32 per process
constexpr std::size_t staged_window = std::size_t{1} << 20;

/// The process's row block of "w" and a [256, 1024] "r" held by every process, copied into fake
/// device memory.
struct device_rows {
  fake_runtime& fake;
  row_block host;
  std::vector<float> r_host = std::vector<float>(256 * 1024);
  void *w_dev = nullptr, *r_dev = nullptr;
  cairn::state_dict sd;
  device_rows(fake_runtime& f, int rank, int world, float base, bool fill)
      : fake(f), host(rank, world, base, staged_rows, staged_cols) {
    for (std::size_t i = 0; i < r_host.size(); ++i) r_host[i] = base - static_cast<float>(i);
    w_dev = fake.device_malloc(host.w.size() * 4);
    r_dev = fake.device_malloc(r_host.size() * 4);
    if (fill) {
      fake.device_write(w_dev, host.w.data(), host.w.size() * 4);
      fake.device_write(r_dev, r_host.data(), r_host.size() * 4);
    }
    sd.add("w", cairn::from_rank_offsets("w", std::span(static_cast<float*>(w_dev), host.w.size()),
                                         {staged_rows, staged_cols}, {{0, rank, world}}));
    sd.add("r", cairn::replicated("r", std::span(static_cast<float*>(r_dev), r_host.size()),
                                  {256, 1024}, rank));
  }
  ~device_rows() {
    fake.device_free(w_dev);
    fake.device_free(r_dev);
  }
  bool on_device_as_host() const {
    auto w = fake.device_read(w_dev, host.w.size() * 4);
    auto r = fake.device_read(r_dev, r_host.size() * 4);
    return std::memcmp(w.data(), host.w.data(), w.size()) == 0 &&
           std::memcmp(r.data(), r_host.data(), r.size()) == 0;
  }
};

}  // namespace

TEST_CASE("mpi: device tensors save and load through a bounded staging window") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.size();
  const std::string dir = shared_temp_dir(comm);
  cairn::file_storage st(dir);
  fake_runtime fake;
  {
    device_rows saved(fake, rank, world, 3.0f, true);
    cairn::save_options so;
    so.cuda_runtime = &fake.api();
    so.staging_window = staged_window;
    cairn::save(saved.sd, st, comm, so);
  }
  CHECK(fake.stats().peak_pinned_bytes <= staged_window);
  CHECK(loads_rows(st, comm, 3.0f, staged_rows, staged_cols));  // into host memory
  device_rows loaded(fake, rank, world, 3.0f, false);
  cairn::load_options lo;
  lo.cuda_runtime = &fake.api();
  lo.staging_window = staged_window;
  lo.broadcast_min_bytes = 1 << 10;  // "r" is read once and passed on, device to device
  cairn::load(loaded.sd, st, comm, lo);
  CHECK(loaded.on_device_as_host());
  CHECK(fake.stats().peak_pinned_bytes <= staged_window);
  CHECK(fake.misuse().empty());
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
