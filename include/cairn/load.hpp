// cairn/load.hpp: loading a checkpoint into a state tree of any topology, and reading parts
// of a checkpoint without a tree (common state, whole tensors).
#pragma once

#include <fnmatch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/cuda/device_leaves.hpp"
#include "cairn/detail/parallel.hpp"
#include "cairn/format/layout.hpp"
#include "cairn/format/metadata.hpp"
#include "cairn/format/native.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/cover.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/visit.hpp"

namespace cairn {

/// Options of `load`.
/// How `load` treats keys that do not match the checkpoint, with the meanings of Megatron's
/// StrictHandling. "Unexpected" keys are keys the tree asks for that the checkpoint lacks;
/// "missing" keys are checkpoint keys no rank asked for (finding them costs one all-gather).
enum class strict_mode {
  assume_ok_unexpected,  ///< no check up front: loading an unexpected key fails (the default)
  log_unexpected,        ///< log unexpected keys and skip them
  log_all,               ///< log unexpected and missing keys; skip the unexpected ones
  raise_unexpected,      ///< fail (before reading data) when a key is unexpected
  raise_all,             ///< fail when a key is unexpected or missing
  return_unexpected,     ///< skip unexpected keys and report them in load_stats
  return_all,            ///< skip unexpected keys; report unexpected and missing keys
  ignore_all,            ///< skip unexpected keys silently
};

/// Options of `load`.
struct load_options {
  /// Threads each rank uses to read.
  int io_threads = 2;
  /// Load only the common values of the tree; tensors and objects are left untouched.
  bool common_only = false;
  /// What to do about keys that do not match.
  strict_mode strict = strict_mode::assume_ok_unexpected;
  /// Renamed keys: tree key -> key in the checkpoint (load a checkpoint saved under old names).
  std::map<std::string, std::string> key_mapping;
  /// Globs over tree keys (`model.*`, `layer*.weight`, fnmatch syntax): matching leaves are
  /// not loaded and keep their values.
  std::vector<std::string> ignore_keys;
  /// Called with this rank's tree keys (after ignore_keys); keys it removes are not loaded.
  std::function<void(std::vector<std::string>& keys)> edit_keys;
  /// Where the log_* modes write (one message per call); stderr when empty.
  std::function<void(const std::string&)> log;
  /// How a sharded object finds its saved copy when the checkpoint holds the object's key on
  /// a different grid (per-rank RNG state saved on 4 ranks, loaded on 2). Called with the key,
  /// the saved grid, this rank's position and its grid; returns the saved position to load,
  /// or nullopt to leave the value as it is. Unset: a changed grid is an error naming the key.
  /// `objects_modulo()` is the usual choice for RNG state.
  std::function<std::optional<shape>(
      const std::string& key, const shape& saved_grid, const shape& offset, const shape& grid)>
      object_mapping;
  /// The CUDA runtime used to copy loaded bytes into tensors that live in device memory, through
  /// pinned host memory (null: the default runtime). Without a usable device every tensor is
  /// host memory.
  const cuda::runtime_api* cuda_runtime = nullptr;
  /// A tensor piece that every rank asks for whole and alike (a replicated tensor) is read by
  /// one rank and broadcast through the communicator, instead of being read by every rank:
  /// storage serves it once (it matters most for object stores and shared filesystems).
  /// Pieces smaller than `broadcast_min_bytes` are read by every rank (one broadcast each
  /// would cost more). Costs one all-gather of the pieces each rank asks for.
  bool read_once_broadcast = true;
  std::uint64_t broadcast_min_bytes = std::uint64_t{64} << 10;
};

/// An `object_mapping` that loads, on a changed grid, the saved object at this rank's position
/// modulo the saved grid on each axis: rank r of M loads what rank r mod N of N saved.
inline auto objects_modulo() {
  return [](const std::string&, const shape& saved_grid, const shape& offset,
            const shape& grid) -> std::optional<shape> {
    if (saved_grid.size() != grid.size()) return std::nullopt;
    shape at(offset.size());
    for (std::size_t a = 0; a < offset.size(); ++a)
      at[a] = saved_grid[a] > 0 ? offset[a] % saved_grid[a] : 0;
    return at;
  };
}

/// What one rank did during a load.
struct load_stats {
  std::uint64_t bytes_read = 0;    ///< bytes read from storage (whole checksum blocks)
  std::uint64_t bytes_needed = 0;  ///< bytes of the target that came from the checkpoint
  double seconds = 0;
  std::vector<std::string> unexpected;  ///< tree keys not in the checkpoint (skipped)
  std::vector<std::string> missing;     ///< checkpoint keys no rank asked for (*_all modes)
};

/// A whole tensor read from a checkpoint, owning its bytes (row-major, little-endian).
struct tensor_data {
  dtype type = dtype::f32;
  shape global_shape;
  std::vector<std::byte> data;
  /// The data viewed as T; T must match `type`.
  template <element_type T>
  std::span<const T> as() const {
    if (dtype_of<T> != type)
      throw exception(make_error(errc::mismatch, "tensor is " + std::string(dtype_name(type)) +
                                                     ", asked for " +
                                                     std::string(dtype_name(dtype_of<T>))));
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
};

namespace detail {

/// One copy from a saved chunk into a target piece: the elements of `region`.
struct copy_job {
  const chunk_record* chunk;
  box region;      ///< global coordinates, inside both the chunk and the target box
  std::byte* dst;  ///< start of the target piece's memory
  box dst_box;     ///< the target piece, row-major at `dst`
  std::size_t elem_size;
  std::string key;
};

/// Adds the jobs that fill `dst_box` (row-major at `dst`) from the chunks of `rec`. Fails
/// unless the chunks it uses tile the part of `dst_box` inside the saved tensor exactly: two
/// chunks that overlap there, or a gap (a checkpoint saved with access-integrity validation off,
/// a chunk listed twice, a shifted offset) are errc::integrity errors naming the key and the
/// elements involved, so a load never leaves part of its target unwritten or filled twice.
inline result<void> plan_copies(const tensor_record& rec,
                                const std::string& key,
                                const box& dst_box,
                                std::byte* dst,
                                std::vector<copy_job>& jobs) {
  std::optional<box> inside;
  if (dst_box.size.empty())
    inside = dst_box;
  else
    inside = intersect(dst_box, box{shape(rec.global_shape.size(), 0), rec.global_shape});
  if (!inside) return ok();  // all padding (allow_shape_mismatch): nothing was saved there
  const std::size_t first = jobs.size();
  std::vector<box> parts;
  for (const auto& c : rec.chunks) {
    std::optional<box> x =
        dst_box.size.empty() ? std::optional<box>(c.region) : intersect(c.region, *inside);
    if (!x) continue;
    parts.push_back(*x);
    jobs.push_back(copy_job{&c, std::move(*x), dst, dst_box, dtype_size(rec.type), key});
  }
  if (auto p = check_exact_cover(parts, *inside)) {
    std::string a = jobs[first + p->first].chunk->region.str();
    std::string b = jobs[first + p->second].chunk->region.str();
    jobs.resize(first);
    if (p->what == cover_problem::kind::overlap)
      return std::move(make_error(errc::integrity,
                                  "the checkpoint's chunks " + a + " and " + b + " both hold " +
                                      p->shared.str() + " (elements of " + inside->str() +
                                      " this rank loads): the checkpoint is corrupt or was saved "
                                      "with overlapping shards"))
          .with_key(key);
    return std::move(make_error(errc::integrity,
                                "the checkpoint's chunks cover " + std::to_string(p->covered) +
                                    " of the " + std::to_string(p->wanted) + " elements of " +
                                    inside->str() +
                                    " (it was saved with gaps, or its metadata is corrupt)"))
        .with_key(key);
  }
  return ok();
}

/// Reads what the jobs need, whole checksum blocks only, verifies them, and copies into
/// place. A chunk that maps one-to-one onto its target is read straight into target memory.
inline result<void> run_copies(storage_ref st,
                               const checkpoint_metadata& m,
                               const std::vector<copy_job>& jobs,
                               int threads,
                               load_stats& stats,
                               gather_buffers* pool = nullptr) {
  const std::uint64_t B = m.block_size;
  // Reads that cannot go straight to the target go through reused buffers (fresh memory costs
  // a page fault per 4 KiB), at most one buffer per thread.
  std::optional<gather_buffers> own;
  if (!pool || pool->size() < B)
    pool = &own.emplace(std::max<std::size_t>(std::size_t{8} << 20, B));
  const std::uint64_t temp_blocks = std::max<std::uint64_t>(1, pool->size() / B);
  std::map<const chunk_record*, std::vector<std::size_t>> by_chunk;
  for (std::size_t j = 0; j < jobs.size(); ++j) by_chunk[jobs[j].chunk].push_back(j);
  struct read_op {
    const chunk_record* chunk;
    std::uint64_t first_block, last_block;
    std::byte* direct;  // read straight here when not null
    const std::vector<std::size_t>* jobs;
  };
  std::vector<read_op> ops;
  const std::uint64_t blocks_per_io = std::max<std::uint64_t>(1, max_io_bytes / B);
  struct run {
    std::uint64_t lo, hi;  // bytes of the chunk
    std::byte* dst;        // where byte `lo` goes
  };
  for (const auto& chunk_jobs : by_chunk) {
    // Named copies: lambdas below use them, and clang < 16 cannot capture structured bindings.
    const chunk_record* const chunk = chunk_jobs.first;
    const std::vector<std::size_t>& js = chunk_jobs.second;
    // Every run of the chunk that some job needs, and the blocks they touch as sorted, merged
    // intervals.
    std::vector<run> runs;
    for (std::size_t j : js) {
      const copy_job& job = jobs[j];
      std::uint64_t es = job.elem_size;
      for_each_run(chunk->region, job.dst_box, job.region,
                   [&](std::int64_t s, std::int64_t t, std::int64_t n) {
                     std::uint64_t lo = static_cast<std::uint64_t>(s) * es;
                     std::uint64_t hi = lo + static_cast<std::uint64_t>(n) * es;
                     stats.bytes_needed += hi - lo;
                     runs.push_back({lo, hi, job.dst + static_cast<std::uint64_t>(t) * es});
                   });
    }
    std::sort(runs.begin(), runs.end(), [](const run& a, const run& b) { return a.lo < b.lo; });
    std::vector<std::uint64_t> max_hi(runs.size());  // the largest hi of runs[0..i]
    for (std::size_t i = 0; i < runs.size(); ++i)
      max_hi[i] = std::max(runs[i].hi, i ? max_hi[i - 1] : 0);
    // Where to read bytes [lo, hi) of the chunk straight into, when exactly one run needs them
    // all (no other run touches them): null otherwise.
    auto direct_for = [&](std::uint64_t lo, std::uint64_t hi) -> std::byte* {
      auto it = std::upper_bound(runs.begin(), runs.end(), lo,
                                 [](std::uint64_t v, const run& r) { return v < r.lo; });
      if (it == runs.begin()) return nullptr;
      std::size_t i = static_cast<std::size_t>(it - runs.begin()) - 1;
      if (runs[i].hi < hi || (i > 0 && max_hi[i - 1] > lo) ||
          (i + 1 < runs.size() && runs[i + 1].lo < hi))
        return nullptr;
      return runs[i].dst + (lo - runs[i].lo);
    };
    std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
    for (const run& r : runs) {
      std::pair<std::uint64_t, std::uint64_t> b{r.lo / B, (r.hi - 1) / B};
      if (!merged.empty() && b.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, b.second);
      else
        merged.push_back(b);
    }
    const std::uint64_t chunk_bytes = chunk->where.nbytes;
    auto add_op = [&](std::uint64_t b0, std::uint64_t b1) {
      std::uint64_t lo = b0 * B, hi = std::min(chunk_bytes, (b1 + 1) * B);
      if (std::byte* direct = direct_for(lo, hi)) {
        ops.push_back(read_op{chunk, b0, b1, direct, &js});
        return;
      }
      for (std::uint64_t b = b0; b <= b1; b += temp_blocks)
        ops.push_back(read_op{chunk, b, std::min(b1, b + temp_blocks - 1), nullptr, &js});
    };
    for (const auto& [b0, b1] : merged) {
      // The first and last blocks of an interval are often shared with bytes no run needs:
      // they get ops of their own, so that the blocks between can go straight to the target.
      std::uint64_t first = b0, last = b1;
      if (first < last && !direct_for(first * B, (first + 1) * B)) add_op(first, first), ++first;
      bool tail = first < last && !direct_for(last * B, std::min(chunk_bytes, (last + 1) * B));
      if (tail) --last;
      for (std::uint64_t b = first; b <= last; b += blocks_per_io)
        add_op(b, std::min(last, b + blocks_per_io - 1));
      if (tail) add_op(last + 1, last + 1);
    }
  }
  std::atomic<std::uint64_t> bytes_read{0};
  auto r = run_parallel(ops.size(), threads, [&](std::size_t k) -> result<void> {
    const read_op& op = ops[k];
    const extent& e = op.chunk->where;
    const copy_job& j0 = jobs[op.jobs->front()];
    std::uint64_t lo = op.first_block * B;
    std::uint64_t len = std::min(e.nbytes, (op.last_block + 1) * B) - lo;
    std::unique_ptr<std::byte[]> temp;  // from the pool, not zeroed: every byte is read into
    std::span<std::byte> buf;
    if (op.direct) {
      buf = {op.direct, static_cast<std::size_t>(len)};
    } else {
      temp = pool->take();
      buf = {temp.get(), static_cast<std::size_t>(len)};
    }
    struct give_back {
      gather_buffers* pool;
      std::unique_ptr<std::byte[]>& b;
      ~give_back() {
        if (b) pool->give(std::move(b));
      }
    } returned{pool, temp};
    std::string what = "chunk " + op.chunk->region.str() + " of tensor";
    CAIRN_TRY(read_verified_blocks(st, m, e, op.first_block, op.last_block, buf, j0.key, what));
    bytes_read += len;
    if (op.direct) return ok();
    for (std::size_t j : *op.jobs) {
      const copy_job& job = jobs[j];
      std::uint64_t es = job.elem_size;
      for_each_run(op.chunk->region, job.dst_box, job.region,
                   [&](std::int64_t s, std::int64_t t, std::int64_t n) {
                     std::uint64_t a = static_cast<std::uint64_t>(s) * es;
                     std::uint64_t b = a + static_cast<std::uint64_t>(n) * es;
                     std::uint64_t x = std::max(a, lo), y = std::min(b, lo + len);
                     if (x >= y) return;
                     std::memcpy(job.dst + static_cast<std::uint64_t>(t) * es + (x - a),
                                 buf.data() + (x - lo), y - x);
                   });
    }
    return ok();
  });
  stats.bytes_read += bytes_read;
  return r;
}

/// Rank 0 reads the metadata of whatever layout is on `st` (native, torch_dist, safetensors)
/// and broadcasts it as JSON; every rank decodes the same bytes. Only a foreign layout's
/// description may go without checksums.
inline result<checkpoint_metadata> read_metadata_collective(storage_ref st, comm_ref comm) {
  bytes msg;
  if (comm.rank() == 0) {
    binary_writer w;
    auto m = catch_all("reading the metadata", [&] { return read_any_metadata_json(st); });
    put_error(w, m ? std::nullopt : std::optional<error>(m.err()));
    w.u8(m && m->foreign);
    w.str(m ? m->json : std::string());
    msg = std::move(w.data());
  }
  comm.broadcast(msg, 0);
  binary_reader r(msg);
  if (auto f = get_error(r)) return std::move(*f).with_rank(0);
  bool foreign = r.u8();
  return metadata_from_json(r.str(), st.describe(metadata_name), /*allow_unverified=*/foreign);
}

/// The common values of a checkpoint, decoded (reads and verifies the common-state file).
inline result<std::map<std::string, common_value>> read_commons(storage_ref st,
                                                                const checkpoint_metadata& m) {
  std::map<std::string, common_value> out = m.inline_commons;
  if (!m.common) return out;
  CAIRN_TRY_ASSIGN(auto buf, read_extent(st, m, *m.common, "", "common state"));
  for (const auto& [path, rec] : m.commons) {
    if (rec.offset + rec.nbytes > buf.size())
      return std::move(make_error(errc::corrupt, "common value lies outside the common state"))
          .with_key(path);
    common_value v;
    v.kind = rec.kind;
    v.type = rec.type;
    v.data.assign(buf.begin() + static_cast<std::ptrdiff_t>(rec.offset),
                  buf.begin() + static_cast<std::ptrdiff_t>(rec.offset + rec.nbytes));
    out.emplace(path, std::move(v));
  }
  return out;
}

/// Loads every leaf of this rank from an already-read metadata.
/// A tensor piece of this rank's tree: (tensor leaf, piece index).
using piece_ref = std::pair<std::size_t, std::size_t>;

/// Loads this rank's leaves. Pieces in `skip` are left for a broadcast from another rank.
inline result<void> load_leaves_local(const leaf_list& leaves,
                                      storage_ref st,
                                      const checkpoint_metadata& m,
                                      const load_options& opt,
                                      load_stats& stats,
                                      const std::set<piece_ref>& skip = {},
                                      gather_buffers* pool = nullptr) {
  if (!leaves.commons.empty()) {
    CAIRN_TRY_ASSIGN(auto commons, read_commons(st, m));
    for (const auto& c : leaves.commons) {
      auto it = commons.find(c.path);
      if (it == commons.end())
        return std::move(make_error(errc::not_found, "common value is not in the checkpoint"))
            .with_key(c.path);
      const common_value* stored = &it->second;
      std::optional<common_value> coerced;
      if (m.inline_commons.count(c.path)) {
        // A foreign layout stores Python values (int, float, bool): take them as the target's
        // dtype when they fit exactly.
        common_value want = c.encode(c.value);
        if (want.kind == stored->kind && (coerced = coerce_common(*stored, want.type)))
          stored = &*coerced;
      }
      if (auto d = c.decode(*stored, c.value); !d) return std::move(d).err().with_key(c.path);
    }
  }
  if (opt.common_only) return ok();
  std::vector<copy_job> jobs;
  for (std::size_t ti = 0; ti < leaves.tensors.size(); ++ti) {
    const tensor_leaf& t = leaves.tensors[ti];
    const tensor_layout& L = t.layout;
    auto it = m.tensors.find(L.key);
    if (it == m.tensors.end())
      return std::move(make_error(errc::not_found, "tensor is not in the checkpoint"))
          .with_key(L.key);
    const tensor_record& rec = it->second;
    if (rec.type != L.type)
      return std::move(make_error(errc::mismatch,
                                  "checkpoint holds " + std::string(dtype_name(rec.type)) +
                                      ", the target is " + std::string(dtype_name(L.type)) +
                                      " (cairn never converts silently)"))
          .with_key(L.key);
    std::size_t es = dtype_size(L.type);
    if (t.nbytes % es != 0)
      return std::move(make_error(errc::invalid_argument,
                                  "data size is not a multiple of the "
                                  "element size"))
          .with_key(L.key);
    CAIRN_TRY(validate_layout(L, t.nbytes / es));
    if (rec.global_shape != L.global_shape) {
      if (!L.allow_shape_mismatch || rec.global_shape.size() != L.global_shape.size())
        return std::move(
                   make_error(errc::mismatch,
                              "global shape " +
                                  box{shape(rec.global_shape.size(), 0), rec.global_shape}.str() +
                                  " in the checkpoint, " +
                                  box{shape(L.global_shape.size(), 0), L.global_shape}.str() +
                                  " in the target (set allow_shape_mismatch to load into a "
                                  "padded tensor)"))
            .with_key(L.key);
      std::memset(t.data, 0, t.nbytes);
    }
    auto ps = pieces_of(L);
    for (std::size_t pi = 0; pi < ps.size(); ++pi)
      if (!skip.count({ti, pi}))
        CAIRN_TRY(plan_copies(rec, L.key, ps[pi].region, t.data + ps[pi].data_offset * es, jobs));
  }
  CAIRN_TRY(run_copies(st, m, jobs, opt.io_threads, stats, pool));
  for (const auto& o : leaves.objects) {
    std::string u = object_unique_key(o.key, o.global_offset, o.global_shape);
    auto it = m.objects.find(u);
    if (it == m.objects.end()) {
      for (const auto& [k, rec] : m.objects) {
        if (rec.key != o.key || rec.global_shape == o.global_shape) continue;
        if (opt.object_mapping) {
          auto at = opt.object_mapping(o.key, rec.global_shape, o.global_offset, o.global_shape);
          if (!at) break;  // leave the value as it is
          std::string mapped = object_unique_key(o.key, *at, rec.global_shape);
          it = m.objects.find(mapped);
          if (it == m.objects.end())
            return std::move(make_error(errc::not_found, "object_mapping maps " + u + " to " +
                                                             mapped +
                                                             ", which is not in the checkpoint"))
                .with_key(o.key);
          break;
        }
        return std::move(
                   make_error(errc::mismatch,
                              "sharded object was saved as a grid of " +
                                  box{shape(rec.global_shape.size(), 0), rec.global_shape}.str() +
                                  " (world size " + std::to_string(m.world_size) +
                                  "), this rank asks for " + u +
                                  ": the topology changed; give the object a grid that exists "
                                  "in the checkpoint, set load_options::object_mapping "
                                  "(objects_modulo(), say), or leave it out of the tree"))
            .with_key(o.key);
      }
      if (it == m.objects.end() && opt.object_mapping &&
          std::any_of(m.objects.begin(), m.objects.end(), [&](const auto& kv) {
            return kv.second.key == o.key && kv.second.global_shape != o.global_shape;
          }))
        continue;  // the mapping chose to leave it
      if (it == m.objects.end())
        return std::move(
                   make_error(errc::not_found, "sharded object " + u + " is not in the checkpoint"))
            .with_key(o.key);
    }
    CAIRN_TRY_ASSIGN(auto buf, read_extent(st, m, it->second.where, o.key, "object " + u));
    stats.bytes_read += buf.size();
    if (auto d = o.decode(buf, o.value); !d) return std::move(d).err().with_key(o.key);
  }
  return ok();
}

/// The non-template body of `load`.
/// The key a leaf is known by in the tree (tensor key, object key, common path).
inline const std::string& tree_key(const tensor_leaf& t) { return t.layout.key; }
inline const std::string& tree_key(const object_leaf& o) { return o.key; }
inline const std::string& tree_key(const common_leaf& c) { return c.path; }

/// Applies ignore globs, the edit callback and key mapping; returns the leaves to load, with
/// checkpoint keys in place of tree keys.
inline leaf_list select_leaves(const leaf_list& leaves, const load_options& opt) {
  std::vector<std::string> keys;
  auto ignored = [&](const std::string& k) {
    for (const auto& g : opt.ignore_keys)
      if (::fnmatch(g.c_str(), k.c_str(), 0) == 0) return true;
    return false;
  };
  auto collect = [&](const auto& list) {
    for (const auto& l : list)
      if (!ignored(tree_key(l))) keys.push_back(tree_key(l));
  };
  collect(leaves.tensors);
  collect(leaves.objects);
  collect(leaves.commons);
  if (opt.edit_keys) opt.edit_keys(keys);
  std::set<std::string> keep(keys.begin(), keys.end());
  auto mapped = [&](const std::string& k) {
    auto it = opt.key_mapping.find(k);
    return it == opt.key_mapping.end() ? k : it->second;
  };
  leaf_list out;
  out.keep_alive = leaves.keep_alive;
  out.after_load = leaves.after_load;
  for (auto t : leaves.tensors)
    if (keep.count(t.layout.key)) {
      t.layout.key = mapped(t.layout.key);
      out.tensors.push_back(std::move(t));
    }
  for (auto o : leaves.objects)
    if (keep.count(o.key)) {
      o.key = mapped(o.key);
      out.objects.push_back(std::move(o));
    }
  for (auto c : leaves.commons)
    if (keep.count(c.path)) {
      c.path = mapped(c.path);
      out.commons.push_back(std::move(c));
    }
  return out;
}

/// Checkpoint keys of every kind: tensor keys, object keys, common paths.
inline std::set<std::string> checkpoint_keys(const checkpoint_metadata& m) {
  std::set<std::string> keys;
  for (const auto& [k, t] : m.tensors) keys.insert(k);
  for (const auto& [u, o] : m.objects) keys.insert(o.key);
  for (const auto& [k, c] : m.commons) keys.insert(k);
  return keys;
}

/// Applies the strict mode: finds unexpected (and, for *_all modes, missing) keys, drops
/// unexpected leaves, logs or fails as the mode says. Collective for the *_all modes.
inline result<void> apply_strict(leaf_list& leaves,
                                 const checkpoint_metadata& m,
                                 comm_ref comm,
                                 const load_options& opt,
                                 load_stats& stats) {
  using sm = strict_mode;
  if (opt.strict == sm::assume_ok_unexpected) return ok();
  std::set<std::string> saved = checkpoint_keys(m);
  std::set<std::string> unexpected;
  auto drop = [&](auto& list) {
    std::erase_if(list, [&](const auto& l) {
      if (saved.count(tree_key(l))) return false;
      unexpected.insert(tree_key(l));
      return true;
    });
  };
  std::set<std::string> requested;
  for (const auto& t : leaves.tensors) requested.insert(t.layout.key);
  for (const auto& o : leaves.objects) requested.insert(o.key);
  for (const auto& c : leaves.commons) requested.insert(c.path);
  drop(leaves.tensors);
  drop(leaves.objects);
  drop(leaves.commons);
  stats.unexpected.assign(unexpected.begin(), unexpected.end());
  bool all =
      opt.strict == sm::log_all || opt.strict == sm::raise_all || opt.strict == sm::return_all;
  if (all) {
    detail::binary_writer w;
    w.u64(requested.size());
    for (const auto& k : requested) w.str(k);
    std::set<std::string> everyone;
    for (const auto& b : comm.all_gather(w.data())) {
      detail::binary_reader r(b);
      for (std::uint64_t n = r.u64(); n > 0; --n) everyone.insert(r.str());
    }
    for (const auto& k : saved)
      if (!everyone.count(k)) stats.missing.push_back(k);
  }
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  if (opt.strict == sm::log_unexpected || opt.strict == sm::log_all) {
    auto log = [&](const std::string& msg) {
      if (opt.log)
        opt.log(msg);
      else
        std::fprintf(stderr, "cairn: %s\n", msg.c_str());
    };
    if (!stats.unexpected.empty())
      log("rank " + std::to_string(comm.rank()) +
          ": keys not in the checkpoint (skipped): " + joined(stats.unexpected));
    if (!stats.missing.empty() && comm.rank() == 0)
      log("checkpoint keys nobody loads: " + joined(stats.missing));
  }
  if ((opt.strict == sm::raise_unexpected || opt.strict == sm::raise_all) &&
      !stats.unexpected.empty())
    return std::move(make_error(errc::not_found,
                                "keys not in the checkpoint: " + joined(stats.unexpected)))
        .with_key(stats.unexpected.front());
  if (opt.strict == sm::raise_all && !stats.missing.empty())
    return std::move(make_error(errc::not_found,
                                "checkpoint keys nobody loads: " + joined(stats.missing)))
        .with_key(stats.missing.front());
  return ok();
}

/// One piece that every rank asks for alike: read by `reader`, broadcast to the rest.
struct shared_piece {
  piece_ref local;  ///< this rank's (leaf, piece)
  int reader = 0;
  std::uint64_t nbytes = 0;
  std::byte* data = nullptr;  ///< where the piece lies in this rank's memory
};

/// Finds the pieces every rank asks for whole and alike, and picks a reader for each (the
/// least-loaded rank so far, in key order, so every rank computes the same). Collective.
inline std::vector<shared_piece> plan_shared_pieces(const leaf_list& leaves,
                                                    comm_ref comm,
                                                    const load_options& opt) {
  std::vector<shared_piece> out;
  if (!opt.read_once_broadcast || comm.size() < 2 || opt.common_only) return out;
  // (key, box) -> this rank's piece
  std::map<std::pair<std::string, std::pair<shape, shape>>, shared_piece> mine;
  for (std::size_t ti = 0; ti < leaves.tensors.size(); ++ti) {
    const tensor_leaf& t = leaves.tensors[ti];
    const std::size_t es = dtype_size(t.layout.type);
    auto ps = pieces_of(t.layout);
    for (std::size_t pi = 0; pi < ps.size(); ++pi) {
      std::uint64_t n = static_cast<std::uint64_t>(ps[pi].region.volume()) * es;
      if (n < std::max<std::uint64_t>(opt.broadcast_min_bytes, 1)) continue;
      mine.emplace(
          std::make_pair(t.layout.key, std::make_pair(ps[pi].region.offset, ps[pi].region.size)),
          shared_piece{piece_ref{ti, pi}, 0, n, t.data + ps[pi].data_offset * es});
    }
  }
  binary_writer w;
  w.u64(mine.size());
  for (const auto& [k, v] : mine) {
    w.str(k.first);
    w.u64(k.second.first.size());
    for (auto x : k.second.first) w.u64(static_cast<std::uint64_t>(x));
    for (auto x : k.second.second) w.u64(static_cast<std::uint64_t>(x));
  }
  auto all = comm.all_gather(w.data());
  std::map<std::pair<std::string, std::pair<shape, shape>>, int> count;
  for (const auto& msg : all) {
    binary_reader r(msg);
    std::uint64_t n = r.u64();
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string key = r.str();
      std::uint64_t nd = r.u64();
      shape off(nd), size(nd);
      for (auto& x : off) x = static_cast<std::int64_t>(r.u64());
      for (auto& x : size) x = static_cast<std::int64_t>(r.u64());
      ++count[{std::move(key), {std::move(off), std::move(size)}}];
    }
  }
  std::vector<std::uint64_t> load(static_cast<std::size_t>(comm.size()), 0);
  for (const auto& [k, v] : mine) {  // same order on every rank (std::map)
    if (count[k] != comm.size()) continue;
    auto best = std::min_element(load.begin(), load.end());
    *best += v.nbytes;
    out.push_back(v);
    out.back().reader = static_cast<int>(best - load.begin());
  }
  return out;
}

/// Broadcasts every shared piece from its reader into the other ranks' targets. Collective.
inline void broadcast_shared_pieces(const std::vector<shared_piece>& shared, comm_ref comm) {
  for (const auto& sp : shared) {
    bytes buf;
    if (comm.rank() == sp.reader) buf.assign(sp.data, sp.data + sp.nbytes);
    comm.broadcast(buf, sp.reader);
    if (comm.rank() != sp.reader && buf.size() == sp.nbytes)
      std::memcpy(sp.data, buf.data(), buf.size());
  }
}

inline result<load_stats> load_leaves(const leaf_list& tree_leaves,
                                      storage_ref st,
                                      comm_ref comm,
                                      const load_options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  load_stats stats;
  auto m = read_metadata_collective(st, comm);
  if (!m) return std::move(m).err();
  leaf_list leaves = select_leaves(tree_leaves, opt);
  std::optional<error> failure;
  if (auto s = apply_strict(leaves, *m, comm, opt, stats); !s)
    failure = std::move(s).err().with_rank(comm.rank());
  device_leaf_staging device;  // device-memory tensors load through pinned host memory
  if (!failure && !opt.common_only)
    if (auto r = device.redirect(leaves, opt.cuda_runtime); !r)
      failure = std::move(r).err().with_rank(comm.rank());
  // Pieces every rank asks for alike are read once and broadcast (collective: every rank plans).
  std::vector<shared_piece> shared = plan_shared_pieces(leaves, comm, opt);
  std::set<piece_ref> skip;
  for (const auto& sp : shared)
    if (sp.reader != comm.rank()) skip.insert(sp.local);
  try {
    if (failure) {
      // reported below, after every rank has had its say
    } else if (auto r = load_leaves_local(leaves, st, *m, opt, stats, skip); !r) {
      failure = std::move(r).err().with_rank(comm.rank());
    }
  } catch (...) {
    failure = current_exception_error("loading").with_rank(comm.rank());
  }
  if (!shared.empty()) {
    // Every reader must have its pieces before they are broadcast.
    auto [status, payloads] = exchange_status(comm, failure);
    if (failure) return std::move(*failure);
    if (auto f = first_failure(status))
      return make_error(errc::comm,
                        "load failed on rank " + std::to_string(f->rank) + ": " + f->describe());
    broadcast_shared_pieces(shared, comm);
  }
  try {
    if (failure) {
      // reported below
    } else if (auto d = device.to_device(); !d) {
      failure = std::move(d).err().with_rank(comm.rank());
    } else if (!opt.common_only) {
      for (const auto& merge : leaves.after_load)
        if (auto mr = merge(); !mr) {
          failure = std::move(mr).err().with_rank(comm.rank());
          break;
        }
    }
  } catch (...) {
    failure = current_exception_error("loading").with_rank(comm.rank());
  }
  auto [status, payloads] = exchange_status(comm, failure);
  if (failure) return std::move(*failure);
  if (auto f = first_failure(status))
    return make_error(errc::comm,
                      "load failed on rank " + std::to_string(f->rank) + ": " + f->describe());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace detail

/// Loads a checkpoint into `tree` in place; every rank of `comm` calls it with the shards it
/// wants, in any topology (the checkpoint may have been saved on another number of ranks).
/// Each rank reads only the checksum blocks holding bytes it needs, and verifies them.
template <class Tree>
result<load_stats> try_load(Tree& tree,
                            storage_ref st,
                            comm_ref comm,
                            const load_options& opt = {}) {
  try {
    leaf_list leaves = flatten(tree);
    return detail::load_leaves(leaves, st, comm, opt);
  } catch (...) {
    return detail::current_exception_error("loading").with_rank(comm.rank());
  }
}

/// Throwing form of `try_load`.
template <class Tree>
load_stats load(Tree& tree, storage_ref st, comm_ref comm, const load_options& opt = {}) {
  return try_load(tree, st, comm, opt).value();
}

/// Reads only the common values of a checkpoint (no tensors), by path.
inline result<std::map<std::string, common_value>> load_common(storage_ref st) {
  return detail::catch_all("load_common", [&]() -> result<std::map<std::string, common_value>> {
    CAIRN_TRY_ASSIGN(auto m, read_metadata(st));
    return detail::read_commons(st, m);
  });
}

/// Reads the named tensors whole (any saved sharding), on one process. An empty `keys` reads
/// every tensor.
inline result<std::map<std::string, tensor_data>> load_tensors(storage_ref st,
                                                               std::vector<std::string> keys = {},
                                                               int threads = 2) {
  return detail::catch_all("load_tensors", [&]() -> result<std::map<std::string, tensor_data>> {
    CAIRN_TRY_ASSIGN(auto m, read_metadata(st));
    if (keys.empty())
      for (const auto& [k, t] : m.tensors) keys.push_back(k);
    std::map<std::string, tensor_data> out;
    // Plan first: memory is sized by what the metadata claims, so the claim is checked before
    // anything is allocated (chunks that tile every tensor exactly, files as large as said).
    std::vector<detail::copy_job> jobs;
    std::map<std::string, std::pair<std::size_t, std::size_t>> job_range;  // key -> [first, end)
    std::set<std::uint32_t> files;
    for (const auto& k : keys) {
      auto it = m.tensors.find(k);
      if (it == m.tensors.end())
        return std::move(make_error(errc::not_found, "tensor is not in the checkpoint"))
            .with_key(k);
      if (job_range.count(k)) continue;
      const tensor_record& rec = it->second;
      std::size_t first = jobs.size();
      CAIRN_TRY(detail::plan_copies(
          rec, k, box{shape(rec.global_shape.size(), 0), rec.global_shape}, nullptr, jobs));
      job_range[k] = {first, jobs.size()};
      for (std::size_t j = first; j < jobs.size(); ++j) files.insert(jobs[j].chunk->where.file);
    }
    for (std::uint32_t f : files) CAIRN_TRY(check_file_holds(st, m, f));
    for (const auto& [k, range] : job_range) {
      const tensor_record& rec = m.tensors.at(k);
      tensor_data& d = out[k];
      d.type = rec.type;
      d.global_shape = rec.global_shape;
      d.data.resize(rec.nbytes());
      for (std::size_t j = range.first; j < range.second; ++j) jobs[j].dst = d.data.data();
    }
    load_stats stats;
    CAIRN_TRY(detail::run_copies(st, m, jobs, threads, stats));
    return out;
  });
}

}  // namespace cairn
