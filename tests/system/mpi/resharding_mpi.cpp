// Save on N processes and load on M processes (N, M in 1..world size) with random shardings
// (block, uneven, replicated, flattened, prepended) over a shared directory; element-exact. And
// common values held by pipeline stages, saved on N stages and loaded on M.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "cairn/comm/mpi.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/pipeline_state.hpp"
#include "tests/support/property.hpp"
#include "tests/system/mpi/first_n.hpp"

using namespace cairn_test;

namespace {

/// Saves `c` on the first `n` processes and loads it on the first `m` (shards laid out as
/// `save_kind` and `load_kind`) in directory `dir`; returns what differs on this process. A
/// save or load that throws is returned as a failure too, after every process has passed the
/// same barriers: the processes outside the group that threw must not be left waiting (they
/// would pair their next collective with the next test's).
std::vector<std::string> save_and_load(const std::string& dir,
                                       const property_case& c,
                                       int n,
                                       int m,
                                       layout_kind save_kind,
                                       layout_kind load_kind,
                                       const cairn::save_options& so,
                                       const cairn::load_options& lo = {}) {
  std::vector<std::string> failures;
  {
    first_n sub(n);
    if (sub.comm != MPI_COMM_NULL) {
      try {
        cairn::mpi_communicator comm(sub.comm);
        rank_state rs;
        build_rank(rs, c.specs, c.save_grids, comm.rank(), n, true, save_kind);
        cairn::file_storage disk(dir);
        cairn::save(rs.sd, disk, comm, so);
      } catch (const std::exception& e) {
        failures.push_back(std::string("save threw: ") + e.what());
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  first_n sub(m);
  if (sub.comm == MPI_COMM_NULL) return failures;
  try {
    cairn::mpi_communicator comm(sub.comm);
    rank_state rs;
    build_rank(rs, c.specs, c.load_grids, comm.rank(), m, false, load_kind);
    cairn::file_storage disk(dir);
    cairn::load(rs.sd, disk, comm, lo);
    for (auto& f : rank_failures(rs, c.specs, c.load_grids, comm.rank(), m, load_kind))
      failures.push_back(std::move(f));
  } catch (const std::exception& e) {
    failures.push_back(std::string("load threw: ") + e.what());
  }
  return failures;
}

}  // namespace

TEST_CASE(
    "random shardings (block, uneven, replicated, flattened, prepended) on N processes load on M") {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  cairn::mpi_communicator all(MPI_COMM_WORLD);
  const std::string root = shared_temp_dir(all);
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
        property_case c = random_case(rng, 1 + static_cast<int>(rng() % 3), n, m);
        cairn::save_options so;
        so.block_size = 32 + rng() % 64;
        // Every other combo shares every piece processes want alike, in 40-byte steps.
        cairn::load_options lo;
        if (combos % 2 == 1) lo = {.broadcast_min_bytes = 1, .share_step_bytes = 40};
        for (const auto& f : save_and_load(root + "/ckpt_" + std::to_string(combos), c, n, m,
                                           save_kind, load_kind, so, lo)) {
          ++failures;
          MESSAGE("N=" << n << " M=" << m << " " << f);
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

/// Random shardings (block and flattened saves, block loads) saved on N and loaded on M
/// processes, N, M in 1..world, with the options `configure(so, combo)` sets; checkpoints go
/// under a shared temporary directory, removed at the end. Returns the failures and combos.
template <class Configure>
std::pair<int, int> n_to_m_processes(std::uint32_t seed, Configure configure) {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  cairn::mpi_communicator all(MPI_COMM_WORLD);
  const std::string root = shared_temp_dir(all);
  std::mt19937 rng(seed);  // same sequence on every process
  int failures = 0, combos = 0;
  for (int n = 1; n <= world; ++n) {
    for (int m = 1; m <= world; ++m) {
      for (layout_kind save_kind : {layout_kind::block, layout_kind::flattened}) {
        property_case c = random_case(rng, 1 + static_cast<int>(rng() % 3), n, m);
        cairn::save_options so;
        so.block_size = 32 + rng() % 64;
        configure(so, combos);
        for (const auto& f : save_and_load(root + "/ckpt_" + std::to_string(combos), c, n, m,
                                           save_kind, layout_kind::block, so)) {
          ++failures;
          MESSAGE("N=" << n << " M=" << m << " " << f);
        }
        ++combos;
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(root);
  return {failures, combos};
}

TEST_CASE("scalable planning, format version 3: random shardings on N processes load on M") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto [failures, combos] = n_to_m_processes(1124, [](cairn::save_options& so, int combo) {
    so.scalable_planning = true;
    so.index_files = false;
    so.zstd_level = combo % 2;
  });
  CHECK(failures == 0);
  CHECK(combos == world * world * 2);
}

TEST_CASE("format version 4: random shardings on N processes load on M through index files") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto [failures, combos] = n_to_m_processes(1125, [](cairn::save_options& so, int combo) {
    so.index_files = true;
    so.scalable_planning = combo % 2 == 0;
    so.zstd_level = (combo / 2) % 2;
  });
  CHECK(failures == 0);
  CHECK(combos == world * world * 2);
}

TEST_CASE("every save strategy on N processes loads on M processes") {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  cairn::mpi_communicator all(MPI_COMM_WORLD);
  const std::string root = shared_temp_dir(all);
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
  const cairn::safetensors_strategy chunks(cairn::safetensors::file_split::chunks, 500, 128);
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
      property_case c = random_case(rng, 1 + static_cast<int>(rng() % 3), n, m);
      cairn::save_options so;
      so.strategy = strategy;
      so.zstd_level = strategy ? 0 : 1;
      so.block_size = 64;
      for (const auto& f : save_and_load(root + "/strategy_" + std::to_string(combos), c, n, m,
                                         layout_kind::flattened, layout_kind::block, so)) {
        ++failures;
        MESSAGE(name << " N=" << n << " M=" << m << " " << f);
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
  const std::string root = shared_temp_dir(comm);
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

TEST_CASE("data-parallel replicas of a shard read it once and pass it on between processes") {
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  const int world = comm.size(), rank = comm.rank();
  const int tp = world % 2 == 0 ? 2 : 1, tpr = rank % tp, dpr = rank / tp;
  const std::string root = shared_temp_dir(comm);
  constexpr int layers = 4;
  constexpr std::int64_t rows = 32, cols = 64;
  const std::int64_t n = rows / tp;
  auto value = [](int l, std::int64_t r, std::int64_t c) {
    return static_cast<float>(l * 10000 + r * cols + c);
  };
  auto state = [&](std::vector<std::vector<float>>& w, bool fill, cairn::state_dict& sd) {
    for (int l = 0; l < layers; ++l) {
      auto& wl = w.emplace_back(static_cast<std::size_t>(n * cols), -1.0f);
      for (std::int64_t r = 0; r < n && fill; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          wl[static_cast<std::size_t>(r * cols + c)] = value(l, tpr * n + r, c);
      const std::string k = "layers." + std::to_string(l) + ".weight";
      sd.add(k, cairn::from_rank_offsets(k, std::span(wl), {n, cols}, {{0, tpr, tp}}, dpr));
    }
  };
  cairn::file_storage disk(root);
  {
    std::vector<std::vector<float>> w;
    cairn::state_dict sd;
    state(w, true, sd);
    cairn::save(sd, disk, comm);
  }
  std::vector<std::vector<float>> w;
  cairn::state_dict sd;
  state(w, false, sd);
  // Pieces of 4 KiB (8 KiB on one process), passed on in steps of 1000 bytes.
  auto stats = cairn::load(sd, disk, comm, {.broadcast_min_bytes = 1024, .share_step_bytes = 1000});
  bool exact = true;
  for (int l = 0; l < layers; ++l)
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        exact = exact && w[static_cast<std::size_t>(l)][static_cast<std::size_t>(r * cols + c)] ==
                             value(l, tpr * n + r, c);
  CHECK(exact);
  long long mine[2] = {static_cast<long long>(stats.bytes_read),
                       static_cast<long long>(stats.bytes_from_ranks)};
  long long total[2] = {0, 0};
  MPI_Allreduce(mine, total, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  const long long unique = layers * rows * cols * 4;
  CHECK(total[0] == unique);                          // every shard read once
  CHECK(total[1] == unique * (world / tp) - unique);  // and passed to its other replicas
  comm.barrier();
  if (rank == 0) std::filesystem::remove_all(root);
}

TEST_CASE("common values held by pipeline stages: saved on N processes, loaded on M") {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  cairn::mpi_communicator all(MPI_COMM_WORLD);
  const std::string root = shared_temp_dir(all);
  // k processes: k pipeline stages when they split the layers, else one stage k times replicated.
  auto stages = [](int k) { return pipeline_layers % k == 0 ? k : 1; };
  int failures = 0;
  for (int n = 1; n <= world; ++n) {
    const std::string dir = root + "/pipeline_" + std::to_string(n);
    const std::int64_t base = 500 + n;
    std::string saved_error;
    {
      first_n sub(n);
      if (sub.comm != MPI_COMM_NULL) {
        try {
          cairn::mpi_communicator comm(sub.comm);
          pipeline_rank r(comm.rank(), stages(n), n / stages(n), base);
          cairn::file_storage disk(dir);
          cairn::save(r.sd, disk, comm);
        } catch (const std::exception& e) {
          saved_error = e.what();
        }
      }
    }
    CHECK_MESSAGE(saved_error.empty(), "save on " << n << ": " << saved_error);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int m = 1; m <= world; ++m) {
      first_n sub(m);
      if (sub.comm == MPI_COMM_NULL) continue;
      std::vector<std::string> differ;
      try {
        cairn::mpi_communicator comm(sub.comm);
        pipeline_rank r(comm.rank(), stages(m), m / stages(m), base);
        r.scramble();
        cairn::file_storage disk(dir);
        cairn::load(r.sd, disk, comm, {.strict = cairn::strict_mode::raise_all});
        differ = r.differences(base);
      } catch (const std::exception& e) {
        differ.push_back(std::string("load threw: ") + e.what());
      }
      for (const auto& d : differ) {
        ++failures;
        MESSAGE("saved on " << n << " (pp " << stages(n) << "), loaded on " << m << " (pp "
                            << stages(m) << "), process " << me << ": " << d);
      }
    }
  }
  CHECK(failures == 0);
}
