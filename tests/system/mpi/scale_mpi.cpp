// A training state saved and resumed through the checkpointer with default options by real
// processes under mpirun (128 in ctest, oversubscribed), resharded on the way: saved as
// tensor-parallel 8 × data-parallel world/8, loaded as TP 4 × DP world/4, element-exact. Each
// process counts the bytes it receives through the communicator in each phase (in the load,
// apart from the shared pieces other processes pass it: each TP 4 weight shard is 64 KiB, so
// its DP replicas read it once) and its time; rank 0 prints the figures as JSON
// (docs/benchmarks.md, "The default at 128 processes").
// Exits non-zero on every process when any value is wrong or any phase failed.
//
// usage: mpirun -np N cairn-test-scale-mpi   (N a multiple of 8)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cairn/comm/mpi.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "tests/support/counting_comm.hpp"
#include "tests/support/test_util.hpp"

namespace {

constexpr int layers = 24;           // weights (and their biases)
constexpr std::int64_t rows = 2048;  // of each weight, split over the tensor-parallel ranks
constexpr std::int64_t cols = 32;

/// The value of element (row, col) of weight `layer`.
float value(int layer, std::int64_t row, std::int64_t col) {
  return static_cast<float>(layer * 100000 + row * cols + col);
}

/// A process's state as tensor-parallel rank (rank % tp) of `tp`, data-parallel replica rank /
/// tp: every weight's rows split over the TP group, biases whole; optimizer moments as flat
/// slices of the TP shard over the DP group (a distributed optimizer); a step; an RNG object.
struct state {
  std::vector<std::vector<float>> w, b, m;
  cairn::state_dict sd;
  state(int rank, int world, int tp, bool fill) {
    const int tpr = rank % tp, dpr = rank / tp, dp = world / tp;
    const std::int64_t n = rows / tp;
    for (int l = 0; l < layers; ++l) {
      const std::string k = "layers." + std::to_string(l);
      auto& wl = w.emplace_back(static_cast<std::size_t>(n * cols), -1.0f);
      auto& bl = b.emplace_back(static_cast<std::size_t>(cols), -1.0f);
      if (fill) {
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t c = 0; c < cols; ++c)
            wl[static_cast<std::size_t>(r * cols + c)] = value(l, tpr * n + r, c);
        for (std::int64_t c = 0; c < cols; ++c) bl[static_cast<std::size_t>(c)] = value(l, -1, c);
      }
      auto wt = cairn::from_rank_offsets(k + ".weight", std::span(wl), {n, cols}, {{0, tpr, tp}});
      wt.replica_id = dpr;
      sd.add(k + ".weight", wt);
      sd.add(k + ".bias", cairn::replicated(k + ".bias", std::span(bl), {cols}, rank));
      // The Adam moment of this TP shard, a flat slice per DP rank.
      const std::int64_t lo = n * cols * dpr / dp, hi = n * cols * (dpr + 1) / dp;
      auto& ml = m.emplace_back(static_cast<std::size_t>(hi - lo), -1.0f);
      if (fill)
        for (std::int64_t i = lo; i < hi; ++i)
          ml[static_cast<std::size_t>(i - lo)] = -value(l, tpr * n + i / cols, i % cols);
      sd.add("optim." + k + ".exp_avg",
             cairn::from_rank_offsets_flat("optim." + k + ".exp_avg", std::span(ml), {n, cols},
                                           {{0, tpr, tp}}, cairn::flat_range{lo, hi}));
    }
    sd.add("step", std::int64_t{fill ? 1000 : 0});
  }
  /// Whether every element holds what `state(rank, world, tp, true)` put there.
  bool exact(int rank, int world, int tp) const {
    state want(rank, world, tp, true);
    return w == want.w && b == want.b && m == want.m;
  }
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  cairn::mpi_environment env(argc, argv);
  cairn::mpi_communicator mpi(MPI_COMM_WORLD);
  const int rank = mpi.rank(), world = mpi.size();
  if (world % 8 != 0) {
    if (rank == 0) std::fprintf(stderr, "scale_mpi: the world must be a multiple of 8\n");
    return 2;
  }
  std::vector<cairn_test::collective_use> log;
  cairn_test::counting_comm comm{mpi, &log};
  int ok = 1;
  double save_ms = 0, load_ms = 0;
  std::uint64_t save_rx = 0, load_rx = 0, read = 0, from_ranks = 0;
  const std::string dir = cairn_test::shared_temp_dir(mpi);
  try {
    cairn::file_storage root(dir);
    {
      cairn::checkpointer ckpt(root, comm);  // default options
      state s(rank, world, 8, true);
      mpi.barrier();
      auto t0 = std::chrono::steady_clock::now();
      log.clear();
      ckpt.save(s.sd, {.step = 1000});
      save_ms = since(t0);
      save_rx = cairn_test::counting_comm::received(log);
    }
    {
      cairn::checkpointer ckpt(root, comm);
      state s(rank, world, 4, false);  // resharded: TP 4 × DP world/4
      mpi.barrier();
      auto t0 = std::chrono::steady_clock::now();
      log.clear();
      auto r = ckpt.load_latest(s.sd).value();
      load_ms = since(t0);
      load_rx = cairn_test::counting_comm::received(log);
      ok = r && r->counters.step == 1000 && s.exact(rank, world, 4) ? 1 : 0;
      if (r) read = r->stats.bytes_read, from_ranks = r->stats.bytes_from_ranks;
      if (!ok) std::fprintf(stderr, "scale_mpi: rank %d loaded wrong values\n", rank);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scale_mpi: rank %d: %s\n", rank, e.what());
    ok = 0;
  }
  constexpr int figures = 6;
  const double mine[figures] = {save_ms,
                                static_cast<double>(save_rx),
                                load_ms,
                                static_cast<double>(load_rx - from_ranks),
                                static_cast<double>(read),
                                static_cast<double>(from_ranks)};
  std::vector<double> all(rank == 0 ? figures * static_cast<std::size_t>(world) : 0);
  MPI_Gather(mine, figures, MPI_DOUBLE, all.data(), figures, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    double mx[figures] = {}, mean[figures] = {}, sum[figures] = {};
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < figures; ++i) {
        const double v = all[static_cast<std::size_t>(figures * r + i)];
        mx[i] = std::max(mx[i], v);
        mean[i] += v / world;
        sum[i] += v;
      }
    std::printf(
        "{\"bench\":\"cairn-scale-mpi\",\"processes\":%d,\"tensors\":%d,\"exact\":%s,"
        "\"save\":{\"ms_max\":%.0f,\"ms_mean\":%.0f,\"received_max\":%.0f,\"received_mean\":%.0f,"
        "\"received_rank0\":%.0f},"
        "\"load\":{\"ms_max\":%.0f,\"ms_mean\":%.0f,\"received_max\":%.0f,\"received_mean\":%.0f,"
        "\"received_rank0\":%.0f,\"bytes_read_total\":%.0f,\"bytes_from_ranks_total\":%.0f,"
        "\"bytes_from_ranks_max\":%.0f}}\n",
        world, 3 * layers, all_ok ? "true" : "false", mx[0], mean[0], mx[1], mean[1], all[1], mx[2],
        mean[2], mx[3], mean[3], all[3], sum[4], sum[5], mx[5]);
    std::filesystem::remove_all(dir);
  }
  return all_ok ? 0 : 1;
}
