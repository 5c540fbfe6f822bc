// Save on N processes and load on M processes (N, M in 1..world size) with random shardings
// (block, uneven, replicated, flattened, prepended) over a shared directory; element-exact.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "cairn/comm/mpi.hpp"
#include "cairn/strategies.hpp"
#include "tests/api/property.hpp"

using namespace cairn_test;

namespace {

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

}  // namespace

TEST_CASE(
    "random shardings (block, uneven, replicated, flattened, prepended) on N processes load on M") {
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
  const std::pair<layout_kind, layout_kind> trials[] = {
      {layout_kind::block, layout_kind::block},
      {layout_kind::flattened, layout_kind::block},
      {layout_kind::block, layout_kind::flattened},
      {layout_kind::prepended, layout_kind::block},
      {layout_kind::block, layout_kind::prepended}};
  for (int n = 1; n <= world; ++n) {
    for (int m = 1; m <= world; ++m) {
      for (auto [save_kind, load_kind] : trials) {
        std::vector<tensor_spec> specs = random_specs(rng, 1 + static_cast<int>(rng() % 3));
        std::vector<grid> save_grids, load_grids;
        for (const auto& s : specs) {
          save_grids.push_back(random_grid(rng, s.global, n));
          load_grids.push_back(random_grid(rng, s.global, m));
        }
        std::string dir = root + "/ckpt_" + std::to_string(combos);
        cairn::save_options so;
        so.block_size = 32 + rng() % 64;
        {
          first_n sub(n);
          if (sub.comm != MPI_COMM_NULL) {
            cairn::mpi_communicator comm(sub.comm);
            rank_state rs;
            build_rank(rs, specs, save_grids, comm.rank(), n, true, save_kind);
            cairn::file_storage disk(dir);
            cairn::save(rs.sd, disk, comm, so);
          }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        {
          first_n sub(m);
          if (sub.comm != MPI_COMM_NULL) {
            cairn::mpi_communicator comm(sub.comm);
            rank_state rs;
            build_rank(rs, specs, load_grids, comm.rank(), m, false, load_kind);
            cairn::file_storage disk(dir);
            cairn::load(rs.sd, disk, comm);
            for (const auto& f : rank_failures(rs, specs, load_grids, comm.rank(), m, load_kind)) {
              ++failures;
              MESSAGE("N=" << n << " M=" << m << " " << f);
            }
          }
        }
        ++combos;
      }
    }
  }
  CHECK(failures == 0);
  CHECK(combos == world * world * 5);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(root);
}

TEST_CASE("every save strategy on N processes loads on M processes") {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::string root;
  if (me == 0) root = make_temp_dir();
  {
    cairn::mpi_communicator all(MPI_COMM_WORLD);
    cairn::bytes msg(reinterpret_cast<const std::byte*>(root.data()),
                     reinterpret_cast<const std::byte*>(root.data()) + root.size());
    all.broadcast(msg, 0);
    root.assign(reinterpret_cast<const char*>(msg.data()), msg.size());
  }
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::convert::strategy::one_file);
  const cairn::safetensors_strategy chunks(cairn::convert::strategy::chunks, 500, 128);
  const std::pair<const char*, const cairn::save_strategy*> strategies[] = {
      {"native+zstd", nullptr},
      {"torch_dist", &torch_dist},
      {"one_file", &one_file},
      {"chunks", &chunks}};
  std::mt19937 rng(7);
  int failures = 0, combos = 0;
  for (auto [name, strategy] : strategies) {
    // N processes save, M = N % world + 1 load (a different count whenever world > 1).
    for (int n = 1; n <= world; ++n) {
      int m = n % world + 1;
      auto specs = random_specs(rng, 1 + static_cast<int>(rng() % 3));
      std::vector<grid> save_grids, load_grids;
      for (const auto& sp : specs) {
        save_grids.push_back(random_grid(rng, sp.global, n));
        load_grids.push_back(random_grid(rng, sp.global, m));
      }
      std::string dir = root + "/strategy_" + std::to_string(combos);
      cairn::save_options so;
      so.strategy = strategy;
      so.zstd_level = strategy ? 0 : 1;
      so.block_size = 64;
      {
        first_n sub(n);
        if (sub.comm != MPI_COMM_NULL) {
          cairn::mpi_communicator comm(sub.comm);
          rank_state rs;
          build_rank(rs, specs, save_grids, comm.rank(), n, true, layout_kind::flattened);
          cairn::file_storage disk(dir);
          cairn::save(rs.sd, disk, comm, so);
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      {
        first_n sub(m);
        if (sub.comm != MPI_COMM_NULL) {
          cairn::mpi_communicator comm(sub.comm);
          rank_state rs;
          build_rank(rs, specs, load_grids, comm.rank(), m, false, layout_kind::block);
          cairn::file_storage disk(dir);
          cairn::load(rs.sd, disk, comm);
          for (const auto& f :
               rank_failures(rs, specs, load_grids, comm.rank(), m, layout_kind::block)) {
            ++failures;
            MESSAGE(name << " N=" << n << " M=" << m << " " << f);
          }
        }
      }
      ++combos;
    }
  }
  CHECK(failures == 0);
  CHECK(combos == world * 4);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(root);
}

TEST_CASE("a replicated tensor is read by one process and broadcast to the others") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  std::string root;
  if (comm.rank() == 0) root = make_temp_dir();
  cairn::bytes msg(reinterpret_cast<const std::byte*>(root.data()),
                   reinterpret_cast<const std::byte*>(root.data()) + root.size());
  comm.broadcast(msg, 0);
  root.assign(reinterpret_cast<const char*>(msg.data()), msg.size());
  std::vector<double> w(256 * 128);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 1.0 / static_cast<double>(i + 1);
  cairn::file_storage disk(root);
  {
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(w), {256, 128}, comm.rank()));
    cairn::save(sd, disk, comm);
  }
  std::vector<double> got(w.size(), 0.0);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(got), {256, 128}, comm.rank()));
  auto stats = cairn::load(sd, disk, comm);
  CHECK(got == w);
  long long mine = static_cast<long long>(stats.bytes_read), total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == static_cast<long long>(w.size() * sizeof(double)));
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(root);
}
