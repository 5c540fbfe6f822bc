// Save on N processes and load on M processes (N, M in 1..world size) with random block
// shardings over a shared directory; element-exact.
#include <doctest/doctest.h>

#include <random>

#include "cairn/comm/mpi.hpp"
#include "tests/api/test_util.hpp"

using namespace cairn_test;

namespace {

struct spec {
  std::string key;
  cairn::dtype type;
  cairn::shape global;
};

/// A sub-communicator of the first `n` processes (nullopt on the others).
struct first_n {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit first_n(int n) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &comm);
  }
  ~first_n() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

/// Rank `rank`'s state_dict over its own buffers for the given grids.
void build(cairn::state_dict& sd,
           std::vector<std::vector<std::byte>>& bufs,
           const std::vector<spec>& specs,
           const std::vector<grid>& grids,
           int rank,
           bool fill) {
  bufs.resize(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::int64_t cells = grids[i].cells();
    cairn::box b = grids[i].cell(rank % cells);
    bufs[i].assign(static_cast<std::size_t>(b.volume()) * cairn::dtype_size(specs[i].type),
                   std::byte{0});
    if (fill) fill_block(specs[i].key, specs[i].type, specs[i].global, b, bufs[i].data());
    cairn::sharded_tensor<> t;
    t.key = specs[i].key;
    t.type = specs[i].type;
    t.local_shape = b.size;
    t.global_shape = specs[i].global;
    t.global_offset = b.offset;
    t.replica_id = rank < cells ? 0 : 1;
    t.data = bufs[i];
    sd.add(specs[i].key, t);
  }
}

}  // namespace

TEST_CASE("random block shardings saved on N processes load on M processes") {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  // One shared directory for all processes.
  std::string root;
  if (me == 0) root = make_temp_dir();
  {
    cairn::mpi_communicator all(MPI_COMM_WORLD);
    cairn::bytes msg(reinterpret_cast<const std::byte*>(root.data()),
                     reinterpret_cast<const std::byte*>(root.data()) + root.size());
    all.broadcast(msg, 0);
    root.assign(reinterpret_cast<const char*>(msg.data()), msg.size());
  }
  std::mt19937 rng(99);  // same sequence on every process
  int failures = 0, combos = 0;
  for (int n = 1; n <= world; ++n) {
    for (int m = 1; m <= world; ++m) {
      std::vector<spec> specs;
      int count = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < count; ++i) {
        spec s{"t" + std::to_string(i), cairn::all_dtypes[rng() % cairn::all_dtypes.size()], {}};
        int nd = static_cast<int>(rng() % 4);
        for (int a = 0; a < nd; ++a) s.global.push_back(1 + static_cast<std::int64_t>(rng() % 11));
        specs.push_back(s);
      }
      std::vector<grid> save_grids, load_grids;
      for (const auto& s : specs) {
        save_grids.push_back(random_grid(rng, s.global, n));
        load_grids.push_back(random_grid(rng, s.global, m));
      }
      std::string dir = root + "/ckpt_" + std::to_string(n) + "_" + std::to_string(m);
      cairn::save_options so;
      so.block_size = 32 + rng() % 64;
      {
        first_n sub(n);
        if (sub.comm != MPI_COMM_NULL) {
          cairn::mpi_communicator comm(sub.comm);
          cairn::state_dict sd;
          std::vector<std::vector<std::byte>> bufs;
          build(sd, bufs, specs, save_grids, comm.rank(), true);
          cairn::file_storage disk(dir);
          cairn::save(sd, disk, comm, so);
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      {
        first_n sub(m);
        if (sub.comm != MPI_COMM_NULL) {
          cairn::mpi_communicator comm(sub.comm);
          cairn::state_dict sd;
          std::vector<std::vector<std::byte>> bufs;
          build(sd, bufs, specs, load_grids, comm.rank(), false);
          cairn::file_storage disk(dir);
          cairn::load(sd, disk, comm);
          for (std::size_t i = 0; i < specs.size(); ++i) {
            cairn::box blk = load_grids[i].cell(comm.rank() % load_grids[i].cells());
            std::vector<std::byte> want(bufs[i].size());
            fill_block(specs[i].key, specs[i].type, specs[i].global, blk, want.data());
            if (want != bufs[i]) {
              ++failures;
              MESSAGE("N=" << n << " M=" << m << " " << specs[i].key << " rank " << comm.rank());
            }
          }
        }
      }
      ++combos;
    }
  }
  CHECK(failures == 0);
  CHECK(combos == world * world);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(root);
}
