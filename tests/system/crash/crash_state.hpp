// The training state the crash trials save and check: a small but realistic tree whose every
// byte is a function of (step, world size, rank), so that a checker can tell exactly which step
// a loaded checkpoint holds, and whether it holds one step whole.
//
// Leaves (world W, rank r; K = the world that saved, for the per-rank objects):
//   model.embed   f32  [37, 16]      rows split unevenly over W ranks
//   model.proj    i32  [12, 40]      columns split unevenly (small values: zstd shrinks them)
//   model.qkv     bf16 [24, 18]      a 2-D grid of a x b = W blocks
//   model.norm    f64  [33]          replicated on every rank (replica_id = rank)
//   optim.big     f32  [R, 256]      a flat slice per rank (distributed optimizer); R by size
//   layers.w      u8   [3, 8, 7]     one leaf per layer (prepend_axis_num 1), rows split
//   rng.state     bytes, grid {K}    one object per saving rank, its length varies with step
//   step, optim.lr, meta.tag, sched.milestones   common values
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"

namespace crash {

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t key_seed(const std::string& key) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a: the same in every process
  for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

/// Rows of optim.big per size class (0 small: 16 KiB, 1 medium: 1 MiB, 2 large: 4 MiB).
inline std::int64_t big_rows(int size_class) {
  return size_class <= 0 ? 16 : size_class == 1 ? 1024 : 4096;
}

/// [begin, end) of block `i` of `parts` uneven blocks of `n`.
inline std::pair<std::int64_t, std::int64_t> split(std::int64_t n, int parts, int i) {
  return {n * i / parts, n * (i + 1) / parts};
}

/// a x b = world with a the largest divisor <= sqrt(world) (4 -> 2 x 2, 3 -> 1 x 3).
inline std::pair<int, int> grid_of(int world) {
  int a = 1;
  for (int d = 1; d * d <= world; ++d)
    if (world % d == 0) a = d;
  return {a, world / a};
}

/// Writes the `es` bytes of element `flat` of tensor `key` at step `step` to `out`.
inline void element(std::uint64_t seed,
                    const std::string& key,
                    std::int64_t flat,
                    std::int64_t step,
                    std::size_t es,
                    std::byte* out) {
  std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(flat)) ^
                        (static_cast<std::uint64_t>(step) * 0xD6E8FEB86659FD93ull));
  if (key == "model.proj") {  // small integers: compressible
    std::int32_t v = static_cast<std::int32_t>(h % 7);
    std::memcpy(out, &v, 4);
    return;
  }
  if (key == "optim.big" && (flat / 256) % 2 == 0) {  // every other row compressible
    float v = static_cast<float>(h % 16);
    std::memcpy(out, &v, 4);
    return;
  }
  for (std::size_t b = 0; b < es; ++b) out[b] = static_cast<std::byte>((h >> (8 * (b % 8))) & 0xff);
}

/// The bytes of sharded object `rng.state` at grid position `p` for step `step`.
inline std::vector<std::byte> object_value(std::int64_t step, int p) {
  std::size_t n = 16 + static_cast<std::size_t>((step * 31 + p * 7) % 64);
  std::vector<std::byte> v(n);
  for (std::size_t j = 0; j < n; ++j)
    v[j] = static_cast<std::byte>(mix(static_cast<std::uint64_t>(step) * 1000003u +
                                      static_cast<std::uint64_t>(p) * 7919u + j) &
                                  0xff);
  return v;
}

/// The common values of step `step`.
inline std::int64_t step_value(std::int64_t step) { return step; }
inline double lr_value(std::int64_t step) { return 1e-3 / static_cast<double>(1 + step); }
inline std::string tag_value(std::int64_t step) { return "step " + std::to_string(step); }
inline std::vector<std::int64_t> milestones_value(std::int64_t step) {
  return {step, 2 * step, step * step};
}

/// One tensor leaf of a rank: where its local data sits in the global tensor.
struct tensor_view {
  std::string key;
  std::string entry;  ///< the state_dict entry name
  cairn::dtype type;
  cairn::shape global;
  cairn::box block;                            ///< the local block (global coordinates)
  std::optional<cairn::flat_range> flattened;  ///< a flat slice of `block` only
  std::vector<std::byte>* data = nullptr;
};

/// One rank's state: the buffers, the state_dict viewing them, and what is where.
struct rank_tree {
  cairn::state_dict sd;
  std::deque<std::vector<std::byte>> buffers;  ///< one per tensor leaf (stable addresses)
  std::vector<tensor_view> tensors;
  std::vector<int> object_positions;  ///< grid positions of this rank's rng.state objects
  int object_world = 1;
  int world = 1, rank = 0, size_class = 0;
};

inline std::string object_entry(int p) { return "rng.state#" + std::to_string(p); }

/// Expected local bytes of `v` at step `step`.
inline std::vector<std::byte> expected_bytes(const tensor_view& v, std::int64_t step) {
  std::size_t es = cairn::dtype_size(v.type);
  std::int64_t n = v.block.volume();
  std::int64_t lo = v.flattened ? v.flattened->begin : 0;
  std::int64_t hi = v.flattened ? v.flattened->end : n;
  std::vector<std::byte> out(static_cast<std::size_t>(hi - lo) * es);
  std::uint64_t seed = key_seed(v.key);
  std::size_t nd = v.global.size();
  std::vector<std::int64_t> idx(nd, 0);
  // Start index of element `lo` of the block, row-major.
  std::int64_t rest = lo;
  for (std::size_t d = nd; d-- > 0;) {
    idx[d] = rest % v.block.size[d];
    rest /= v.block.size[d];
  }
  for (std::int64_t k = lo; k < hi; ++k) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < nd; ++d) flat = flat * v.global[d] + v.block.offset[d] + idx[d];
    element(seed, v.key, flat, step, es, out.data() + static_cast<std::size_t>(k - lo) * es);
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < v.block.size[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// Builds rank `rank` of `world`'s tree (buffers filled with 0xA5, common values zero, objects
/// empty). `object_world` is the grid of rng.state: the saving world (saves pass `world`); a
/// rank holds the positions p with p % world == rank.
inline void build(rank_tree& t, int world, int rank, int size_class, int object_world) {
  t = rank_tree{};
  t.world = world;
  t.rank = rank;
  t.size_class = size_class;
  t.object_world = object_world;
  auto add = [&](std::string key, std::string entry, cairn::dtype type, cairn::shape global,
                 cairn::box block, std::optional<cairn::flat_range> flat, int replica_id,
                 int prepend) {
    std::size_t es = cairn::dtype_size(type);
    std::int64_t n = flat ? flat->end - flat->begin : block.volume();
    t.buffers.emplace_back(static_cast<std::size_t>(n) * es, std::byte{0xA5});
    std::vector<std::byte>& buf = t.buffers.back();
    cairn::sharded_tensor<> s;
    s.key = key;
    s.type = type;
    s.global_shape = global;
    s.global_offset = block.offset;
    s.local_shape.assign(block.size.begin() + prepend, block.size.end());
    s.prepend_axis_num = prepend;
    s.replica_id = replica_id;
    s.flattened_range = flat;
    s.data = buf;
    t.sd.add(entry, s);
    t.tensors.push_back(tensor_view{key, entry, type, global, block, flat, &buf});
  };
  {
    auto [b, e] = split(37, world, rank);
    add("model.embed", "model.embed", cairn::dtype::f32, {37, 16}, {{b, 0}, {e - b, 16}}, {}, 0, 0);
  }
  {
    auto [b, e] = split(40, world, rank);
    add("model.proj", "model.proj", cairn::dtype::i32, {12, 40}, {{0, b}, {12, e - b}}, {}, 0, 0);
  }
  {
    auto [a, c] = grid_of(world);
    auto [r0, r1] = split(24, a, rank / c);
    auto [c0, c1] = split(18, c, rank % c);
    add("model.qkv", "model.qkv", cairn::dtype::bf16, {24, 18}, {{r0, c0}, {r1 - r0, c1 - c0}}, {},
        0, 0);
  }
  add("model.norm", "model.norm", cairn::dtype::f64, {33}, {{0}, {33}}, {}, rank, 0);
  {
    std::int64_t rows = big_rows(size_class), n = rows * 256;
    auto [lo, hi] = split(n, world, rank);
    add("optim.big", "optim.big", cairn::dtype::f32, {rows, 256}, {{0, 0}, {rows, 256}},
        cairn::flat_range{lo, hi}, 0, 0);
  }
  for (int l = 0; l < 3; ++l) {
    auto [b, e] = split(8, world, rank);
    add("layers.w", "layers.w#" + std::to_string(l), cairn::dtype::u8, {3, 8, 7},
        {{l, b, 0}, {1, e - b, 7}}, {}, 0, 1);
  }
  for (int p = rank; p < object_world; p += world) {
    t.object_positions.push_back(p);
    t.sd.add(object_entry(p), cairn::byte_object{"rng.state", {}, {object_world}, {p}, 0});
  }
  t.sd.add("step", std::int64_t{0});
  t.sd.add("optim.lr", 0.0);
  t.sd.add("meta.tag", std::string());
  t.sd.add("sched.milestones", std::vector<std::int64_t>{});
}

/// Fills `t` with the state of step `step`.
inline void fill(rank_tree& t, std::int64_t step) {
  for (auto& v : t.tensors) {
    auto want = expected_bytes(v, step);  // copied in: the tensors view these buffers
    std::copy(want.begin(), want.end(), v.data->begin());
  }
  for (int p : t.object_positions)
    std::get<cairn::byte_object>(*t.sd.find(object_entry(p))).value = object_value(step, p);
  t.sd.add("step", step_value(step));
  t.sd.add("optim.lr", lr_value(step));
  t.sd.add("meta.tag", tag_value(step));
  t.sd.add("sched.milestones", milestones_value(step));
}

/// The step a loaded tree says it holds (its `step` common value), or nullopt.
inline std::optional<std::int64_t> loaded_step(const rank_tree& t) {
  const auto* e = t.sd.find("step");
  if (!e) return std::nullopt;
  std::int64_t s = 0;
  if (!std::get<cairn::common_value>(*e).get(s)) return std::nullopt;
  return s;
}

/// What in `t` (after a load) differs from step `step`; for a differing leaf, which of
/// `candidates` it matches instead (the tell-tale of a mixed checkpoint). Empty: all equal.
inline std::vector<std::string> differences(const rank_tree& t,
                                            std::int64_t step,
                                            const std::vector<std::int64_t>& candidates) {
  std::vector<std::string> out;
  auto where = "rank " + std::to_string(t.rank) + "/" + std::to_string(t.world) + ": ";
  auto matches = [&](auto&& same_as_step) {
    std::string m;
    for (std::int64_t c : candidates)
      if (c != step && same_as_step(c)) m += (m.empty() ? "" : ", ") + std::to_string(c);
    return m.empty() ? std::string(" (matches no step in 0.." +
                                   std::to_string(candidates.empty() ? 0 : candidates.back()) + ")")
                     : " (matches step " + m + ")";
  };
  for (const auto& v : t.tensors) {
    if (*v.data == expected_bytes(v, step)) continue;
    std::size_t first = 0;
    auto want = expected_bytes(v, step);
    while (first < want.size() && first < v.data->size() && want[first] == (*v.data)[first])
      ++first;
    out.push_back(where + "tensor " + v.entry + " block " + v.block.str() + " differs from step " +
                  std::to_string(step) + " at byte " + std::to_string(first) + " of " +
                  std::to_string(want.size()) +
                  matches([&](std::int64_t c) { return *v.data == expected_bytes(v, c); }));
  }
  for (int p : t.object_positions) {
    const auto& o = std::get<cairn::byte_object>(*t.sd.find(object_entry(p)));
    if (o.value == object_value(step, p)) continue;
    out.push_back(where + "object rng.state at " + std::to_string(p) + " (" +
                  std::to_string(o.value.size()) + " bytes) differs from step " +
                  std::to_string(step) +
                  matches([&](std::int64_t c) { return o.value == object_value(c, p); }));
  }
  auto common = [&](const char* name, auto want) {
    using T = decltype(want);
    T got{};
    const auto* e = t.sd.find(name);
    if (!e || !std::get<cairn::common_value>(*e).get(got) || !(got == want))
      out.push_back(where + "common value " + name + " differs from step " + std::to_string(step));
  };
  common("step", step_value(step));
  common("optim.lr", lr_value(step));
  common("meta.tag", tag_value(step));
  common("sched.milestones", milestones_value(step));
  return out;
}

}  // namespace crash
