// The resharding property test's building blocks, shared by thread ranks (tests/api) and
// processes under mpirun (tests/mpi): random tensors, and one rank's shards of them in one of
// three layouts.
#pragma once

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "tests/support/test_util.hpp"

namespace cairn_test {

/// A global tensor of the property test.
struct tensor_spec {
  std::string key;
  cairn::dtype type;
  cairn::shape global;
};

/// `count` tensors of random dtype and 0 to 3 axes of extent 1..13.
inline std::vector<tensor_spec> random_specs(std::mt19937& rng, int count) {
  std::vector<tensor_spec> specs;
  for (int i = 0; i < count; ++i) {
    tensor_spec s;
    s.key = "t" + std::to_string(i);
    s.type = cairn::all_dtypes[rng() % cairn::all_dtypes.size()];
    int nd = static_cast<int>(rng() % 4);  // 0..3 axes
    for (int a = 0; a < nd; ++a) s.global.push_back(1 + static_cast<std::int64_t>(rng() % 13));
    specs.push_back(std::move(s));
  }
  return specs;
}

/// How a rank describes its shard of a grid cell.
enum class layout_kind {
  block,      ///< one block; ranks beyond the cell count hold replicas
  flattened,  ///< the cell's holders each hold a flat slice (a distributed optimizer)
  prepended,  ///< one leaf per index of axis 0, without that axis (per-layer tensors stacked
              ///< along a layer axis: prepend_axis_num = 1); 0-d tensors fall back to block
};

inline const char* kind_name(layout_kind k) {
  return k == layout_kind::block       ? "block"
         : k == layout_kind::flattened ? "flattened"
                                       : "prepended";
}

/// Each rank's buffers (one per tensor: its whole cell, or its flat slice) and the state_dict
/// that views them.
struct rank_state {
  std::vector<std::vector<std::byte>> buffers;
  cairn::state_dict sd;
};

/// Rank `rank`'s shard of every tensor. Cell c of a grid is held by ranks c, c + cells, ...
inline void build_rank(rank_state& rs,
                       const std::vector<tensor_spec>& specs,
                       const std::vector<grid>& grids,
                       int rank,
                       int world,
                       bool fill,
                       layout_kind kind = layout_kind::block) {
  rs.buffers.resize(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    std::int64_t cells = grids[i].cells();
    std::int64_t cell = rank % cells;
    int replica = rank < cells ? 0 : rank / static_cast<int>(cells);
    cairn::box b = grids[i].cell(cell);
    std::int64_t es = static_cast<std::int64_t>(cairn::dtype_size(s.type));
    std::vector<std::byte> whole(static_cast<std::size_t>(b.volume() * es), std::byte{0x5a});
    if (fill) fill_block(s.key, s.type, s.global, b, whole.data());
    cairn::sharded_tensor<> t;
    t.key = s.key;
    t.type = s.type;
    t.local_shape = b.size;
    t.global_shape = s.global;
    t.global_offset = b.offset;
    t.replica_id = replica;
    if (kind == layout_kind::flattened) {
      std::int64_t holders = (world - cell + cells - 1) / cells;  // ranks holding this cell
      std::int64_t v = b.volume();
      std::int64_t lo = v * replica / holders, hi = v * (replica + 1) / holders;
      t.flattened_range = cairn::flat_range{lo, hi};
      t.replica_id = 0;
      rs.buffers[i].assign(whole.begin() + lo * es, whole.begin() + hi * es);
      t.data = rs.buffers[i];
      rs.sd.add(s.key, t);
    } else if (kind == layout_kind::prepended && !s.global.empty()) {
      rs.buffers[i] = std::move(whole);
      t.local_shape.assign(b.size.begin() + 1, b.size.end());
      t.prepend_axis_num = 1;
      std::int64_t layer_elems = cairn::numel(t.local_shape);
      for (std::int64_t l = 0; l < b.size[0]; ++l) {
        cairn::sharded_tensor<> layer = t;
        layer.global_offset[0] = b.offset[0] + l;
        layer.data = std::span(rs.buffers[i])
                         .subspan(static_cast<std::size_t>(l * layer_elems * es),
                                  static_cast<std::size_t>(layer_elems * es));
        rs.sd.add(s.key + ".layer" + std::to_string(l), layer);
      }
    } else {
      rs.buffers[i] = std::move(whole);
      t.data = rs.buffers[i];
      rs.sd.add(s.key, t);
    }
  }
}

/// What differs between rank `rank`'s loaded buffers and the expected values (empty: all equal).
inline std::vector<std::string> rank_failures(const rank_state& rs,
                                              const std::vector<tensor_spec>& specs,
                                              const std::vector<grid>& grids,
                                              int rank,
                                              int world,
                                              layout_kind kind) {
  std::vector<std::string> failures;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::int64_t cells = grids[i].cells();
    std::int64_t cell = rank % cells;
    cairn::box b = grids[i].cell(cell);
    std::int64_t es = static_cast<std::int64_t>(cairn::dtype_size(specs[i].type));
    std::vector<std::byte> want(static_cast<std::size_t>(b.volume() * es));
    fill_block(specs[i].key, specs[i].type, specs[i].global, b, want.data());
    if (kind == layout_kind::flattened) {
      int replica = rank < cells ? 0 : rank / static_cast<int>(cells);
      std::int64_t holders = (world - cell + cells - 1) / cells;
      std::int64_t v = b.volume();
      std::int64_t lo = v * replica / holders, hi = v * (replica + 1) / holders;
      want = std::vector<std::byte>(want.begin() + lo * es, want.begin() + hi * es);
    }
    if (want != rs.buffers[i])
      failures.push_back(specs[i].key + " (" + kind_name(kind) + ") on rank " +
                         std::to_string(rank) + " block " + b.str());
  }
  return failures;
}

/// One trial of the property test: tensors, and their shardings on N (save) and M (load)
/// ranks.
struct property_case {
  std::vector<tensor_spec> specs;
  std::vector<grid> save_grids, load_grids;
};

/// `specs` with random grids for `n` saving and `m` loading ranks.
inline property_case random_case(std::mt19937& rng, std::vector<tensor_spec> specs, int n, int m) {
  property_case c;
  c.specs = std::move(specs);
  for (const auto& s : c.specs) {
    c.save_grids.push_back(random_grid(rng, s.global, n));
    c.load_grids.push_back(random_grid(rng, s.global, m));
  }
  return c;
}

/// `count` random tensors with random grids for `n` saving and `m` loading ranks.
inline property_case random_case(std::mt19937& rng, int count, int n, int m) {
  return random_case(rng, random_specs(rng, count), n, m);
}

/// Saves the case on `n` thread ranks (shards laid out as `kind`) into `st`.
inline void save_on_threads(cairn::storage_ref st,
                            const property_case& c,
                            int n,
                            layout_kind kind,
                            const cairn::save_options& so = {},
                            std::vector<cairn::save_plan_cache>* caches = nullptr) {
  cairn::run_ranks(n, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, c.specs, c.save_grids, comm.rank(), n, true, kind);
    cairn::save_options o = so;
    if (caches) o.plan_cache = &caches->at(static_cast<std::size_t>(comm.rank()));
    cairn::save(rs.sd, st, comm, o);
  });
}

/// Loads the case on `m` thread ranks (shards laid out as `kind`) from `st` with `lo`; returns
/// what differs from the expected values (empty: all equal).
inline std::vector<std::string> load_failures_on_threads(cairn::storage_ref st,
                                                         const property_case& c,
                                                         int m,
                                                         layout_kind kind,
                                                         const cairn::load_options& lo = {}) {
  std::mutex mu;
  std::vector<std::string> failures;
  cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, c.specs, c.load_grids, comm.rank(), m, false, kind);
    cairn::load(rs.sd, st, comm, lo);
    auto f = rank_failures(rs, c.specs, c.load_grids, comm.rank(), m, kind);
    std::lock_guard lk(mu);
    failures.insert(failures.end(), f.begin(), f.end());
  });
  return failures;
}

}  // namespace cairn_test
