// Writes a large cairn checkpoint for bench/unshard_rss.sh: `cairn-bench-make-checkpoint DIR GIB`
// saves about GIB GiB from 4 thread ranks — F32 and BF16 weights split by rows and columns, and
// an F32 optimizer state held as flattened distributed-optimizer slices.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cairn-bench-make-checkpoint DIR GIB\n");
    return 2;
  }
  const double gib = std::atof(argv[2]);
  // Each group is 3 tensors of 8192 x 4096: f32 rows, bf16 columns, f32 flattened = 320 MiB.
  const int groups = std::max(1, static_cast<int>(gib * 1024 / 320 + 0.5));
  const std::int64_t R = 8192, C = 4096;
  cairn::file_storage disk(argv[1]);
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<float>> f32s;
    std::vector<std::vector<cairn::bf16>> bf16s;
    cairn::state_dict sd;
    for (int g = 0; g < groups; ++g) {
      std::string layer = "layers." + std::to_string(g);
      auto& w = f32s.emplace_back(static_cast<std::size_t>(R / 4 * C));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 1000) * 0.5f + r;
      sd.add(layer + ".w",
             cairn::from_rank_offsets(layer + ".w", std::span(w), {R / 4, C}, {{0, r, 4}}));
      auto& v = bf16s.emplace_back(static_cast<std::size_t>(R * (C / 4)));
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = cairn::bf16(static_cast<float>(i % 777) - r);
      sd.add(layer + ".v",
             cairn::from_rank_offsets(layer + ".v", std::span(v), {R, C / 4}, {{1, r, 4}}));
      std::int64_t n = R * C, lo = n * r / 4, hi = n * (r + 1) / 4;
      auto& m = f32s.emplace_back(static_cast<std::size_t>(hi - lo), 0.25f * (g + 1));
      auto t = cairn::block(layer + ".exp_avg", std::span(m), {R, C}, {R, C}, {0, 0});
      t.flattened_range = cairn::flat_range{lo, hi};
      sd.add("optim." + layer + ".exp_avg", t);
    }
    sd.add("step", std::int64_t{1000});
    cairn::save(sd, disk, comm);
  });
  std::printf("saved %d x 320 MiB to %s\n", groups, argv[1]);
  return 0;
}
