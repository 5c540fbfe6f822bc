// tests/support/row_block.hpp: one rank's row block of a 2-D f32 tensor "w" whose values follow
// from `base` and the global index, so that any number of ranks can save it and check a load.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cairn/cairn.hpp"

namespace cairn_test {

/// Rank `rank` of `world` holds rows [rank * rows, (rank + 1) * rows) of a [rows * world, cols]
/// tensor "w", element i of its block being base + rank * rows * cols + i.
struct row_block {
  std::vector<float> w;
  cairn::state_dict sd;
  row_block(int rank, int world, float base, std::int64_t rows, std::int64_t cols)
      : w(static_cast<std::size_t>(rows * cols)) {
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = base + static_cast<float>(static_cast<std::size_t>(rank) * w.size() + i);
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {rows, cols}, {{0, rank, world}}));
  }
};

/// Whether the checkpoint in `st` loads, on `comm`, into a zeroed row block as the values of
/// `base`.
inline bool loads_rows(
    cairn::storage_ref st, cairn::comm_ref comm, float base, std::int64_t rows, std::int64_t cols) {
  row_block back(comm.rank(), comm.size(), 0.0f, rows, cols);
  std::fill(back.w.begin(), back.w.end(), 0.0f);
  cairn::load(back.sd, st, comm);
  return back.w == row_block(comm.rank(), comm.size(), base, rows, cols).w;
}

}  // namespace cairn_test
