// cairn/save.hpp: saving a state tree from every rank into the native format.
#pragma once

#include <zstd.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/cuda/device_leaves.hpp"
#include "cairn/detail/binary.hpp"
#include "cairn/detail/parallel.hpp"
#include "cairn/format/checksum.hpp"
#include "cairn/format/layout.hpp"
#include "cairn/format/metadata.hpp"
#include "cairn/format/native.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/save_plan.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/visit.hpp"

namespace cairn {

class save_strategy;

namespace detail {
struct plan_cache_access;
}  // namespace detail

/// Remembers the plan of the last save made with it. A later save whose tree structure and
/// sharding are unchanged on every rank reuses the plan: the ranks exchange a few bytes (a
/// hash of their structure and of their common values) instead of every leaf's description,
/// and skip planning and validation. Use one cache per checkpoint series (not shared between
/// communicators); it is not thread-safe.
class save_plan_cache {
 public:
  /// Saves that reused the cached plan.
  std::size_t hits() const noexcept { return hits_; }
  /// Saves that had to plan from scratch.
  std::size_t misses() const noexcept { return misses_; }
  /// Forgets the plan.
  void clear() noexcept { valid_ = false; }

 private:
  friend struct detail::plan_cache_access;
  bool valid_ = false;
  int world_ = 0;
  std::uint64_t block_size_ = 0, balance_min_bytes_ = 0;
  bool tile_ = true;
  const void* strategy_ = nullptr;
  bool validated_ = false;
  std::vector<std::uint64_t> structure_;  // per rank
  save_layout layout_;
  std::size_t hits_ = 0, misses_ = 0;
};

/// Options of `save`.
struct save_options {
  /// Replace a committed checkpoint in the same place. The old one stays loadable until the
  /// new one commits; its files are removed only after that.
  bool overwrite = false;
  /// Threads each rank uses to write its data file.
  int io_threads = 2;
  /// Checksum block size in bytes; a partial read verifies whole blocks.
  std::uint64_t block_size = default_block_size;
  /// A box held by several ranks (replicas) is split into parts of at least this many bytes,
  /// one per holder at most, so that every rank writes about the same amount.
  std::uint64_t balance_min_bytes = std::uint64_t{64} << 10;
  /// Compress every checksum block of tensor data with zstd at this level (1-19; 0: off, the
  /// default). Partial loads still read only the blocks they need. Worth it for data that
  /// compresses (integer state, sparse or low-entropy tensors); trained fp32/bf16 weights
  /// barely shrink, and compression costs CPU on the write path. Native strategy only.
  int zstd_level = 0;
  /// Cut every written box larger than `block_size` into tiles of at most one block, each
  /// stored row-major with its own checksum, halving each axis in turn. A later load on more
  /// ranks along any axis (tensor-parallel 4 -> 8 of a column-sharded weight, say) then reads
  /// only the tiles it needs instead of every block its rows cross. Costs one copy of the
  /// data through a small buffer on save. Off: boxes are stored row-major as they are.
  bool tile = true;
  /// Check across ranks that shards tile each tensor exactly and common values agree.
  bool validate_access_integrity = true;
  /// Edits a copy of this rank's common values (by path) before they are compared across
  /// ranks (Megatron's preprocess_common_before_consistancy_check): drop or normalize values
  /// that may legitimately differ. What is saved is rank 0's unedited values.
  std::function<void(std::map<std::string, common_value>&)> preprocess_common;
  /// Reuse the plan of the previous save made with this cache when nothing changed.
  save_plan_cache* plan_cache = nullptr;
  /// A string map saved with the checkpoint, readable alone with `read_content_metadata`.
  std::map<std::string, std::string> content_metadata;
  /// The CUDA runtime used to copy tensors that live in device memory into pinned host memory
  /// before writing (null: the default runtime, the real one in `cairn::cuda` builds). Without
  /// a usable device every tensor is host memory.
  const cuda::runtime_api* cuda_runtime = nullptr;
  /// The layout the checkpoint is written in (null: cairn's native format). See
  /// `cairn/strategies.hpp` for torch_dist (PyTorch DCP) and the safetensors layouts, and
  /// `save_strategy` to write your own. Every rank must pass the same strategy.
  const save_strategy* strategy = nullptr;
};

/// What one rank did during a save.
struct save_stats {
  std::string save_id;                        ///< the id in this save's file names
  std::uint64_t bytes_written = 0;            ///< data bytes this rank wrote
  std::size_t chunks_written = 0;             ///< tensor chunks and objects this rank wrote
  std::vector<std::uint64_t> bytes_per_rank;  ///< data bytes every rank wrote (the plan)
  bool plan_reused = false;                   ///< the plan came from the save_plan_cache
  double seconds = 0;
};

namespace detail {

inline std::string new_save_id() {
  std::random_device rd;
  std::uint64_t x =
      (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return checksum_hex(x).substr(0, 12);
}

/// Returns the first failure among gathered statuses, tagged with its rank.
inline std::optional<error> first_failure(const std::vector<std::optional<error>>& status) {
  for (std::size_t r = 0; r < status.size(); ++r)
    if (status[r]) return error(*status[r]).with_rank(static_cast<int>(r));
  return std::nullopt;
}

/// Exchanges a status (and optional payload) with every rank. Returns every rank's status
/// and payload.
inline std::pair<std::vector<std::optional<error>>, std::vector<bytes>> exchange_status(
    comm_ref comm, const std::optional<error>& mine, const bytes& payload = {}) {
  binary_writer w;
  put_error(w, mine);
  w.blob(payload);
  auto all = comm.all_gather(w.data());
  std::vector<std::optional<error>> status;
  std::vector<bytes> payloads;
  for (const auto& b : all) {
    binary_reader r(b);
    status.push_back(get_error(r));
    payloads.push_back(r.blob());
  }
  return {std::move(status), std::move(payloads)};
}

/// One item this rank writes: source bytes and destination in its data file. A tiled item
/// (`tiles` not empty) is the row-major box `region` at `src`, written tile by tile.
struct write_item {
  const std::byte* src;
  std::uint64_t nbytes;
  std::uint64_t file_offset;
  std::string key;
  std::vector<std::uint64_t> checksums;
  box region;         ///< the chunk's box (tiled items)
  tile_counts tiles;  ///< how the chunk is tiled; empty: written as it is
  std::size_t elem_size = 1;
  bool is_object = false;  ///< a sharded object's encoded bytes (owned by the save)
  /// Compressed writes: where each block (or tile) went and its stored length (see `extent`).
  std::vector<std::uint64_t> block_offsets = {}, block_stored = {};
};

/// Buffers that tiled writes gather into, reused across writes (and across saves when the
/// owner keeps it: fresh memory costs a page fault per 4 KiB, and async saves must not
/// allocate). Thread-safe.
class gather_buffers {
 public:
  /// Buffers of `bytes` each.
  explicit gather_buffers(std::size_t bytes = std::size_t{8} << 20) : bytes_(bytes) {}
  /// Size of each buffer.
  std::size_t size() const noexcept { return bytes_; }
  /// A buffer of `size()` bytes, reused when one is free.
  std::unique_ptr<std::byte[]> take() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        auto b = std::move(free_.back());
        free_.pop_back();
        return b;
      }
    }
    return std::unique_ptr<std::byte[]>(new std::byte[bytes_]);
  }
  /// Returns a buffer taken with `take()`.
  void give(std::unique_ptr<std::byte[]> b) {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(b));
  }

 private:
  std::size_t bytes_;
  std::mutex mu_;
  std::vector<std::unique_ptr<std::byte[]>> free_;
};

/// Writes items into one object with `threads` threads, checksumming every block (or tile)
/// first. Tiles are gathered into buffers from `buffers` (a private set when null), several
/// tiles per write.
///
/// With `zstd_level` > 0, every tensor block (or tile) is compressed on its own (kept raw when
/// that does not make it smaller), and runs of blocks are appended to the object in the order
/// they finish: items' `file_offset` is then an output, set with `block_offsets` and
/// `block_stored`; `*file_size` receives the object's size. Objects are stored raw.
inline result<void> write_items(storage_ref st,
                                const std::string& name,
                                std::vector<write_item>& items,
                                std::uint64_t block_size,
                                int threads,
                                gather_buffers* buffers = nullptr,
                                int zstd_level = 0,
                                std::uint64_t* file_size = nullptr) {
  std::optional<gather_buffers> own;
  if (!buffers || buffers->size() < block_size)
    buffers = &own.emplace(std::max<std::size_t>(std::size_t{8} << 20, block_size));
  const std::uint64_t gather_bytes = buffers->size();
  const bool compress = zstd_level > 0;
  CAIRN_TRY_ASSIGN(auto writer, st.open_writer(name));
  struct task {
    std::size_t item;
    std::uint64_t begin, end;  // byte range inside the item, block (or tile) aligned at begin
    std::size_t first_tile = 0, last_tile = 0;  // tiled items: the tiles [first, last)
  };
  // Compressed runs are buffered, so they are kept to about one gather buffer.
  std::uint64_t io = compress ? gather_bytes : max_io_bytes;
  std::uint64_t step = std::max<std::uint64_t>(block_size, io / block_size * block_size);
  std::vector<task> tasks;
  std::vector<std::vector<box>> tiles(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    write_item& it = items[i];
    const bool compressed_item = compress && !it.is_object;
    if (it.tiles.empty()) {
      it.checksums.assign((it.nbytes + block_size - 1) / block_size, 0);
      if (compress && it.is_object)  // one contiguous run
        tasks.push_back({i, 0, it.nbytes});
      else
        for (std::uint64_t b = 0; b < it.nbytes; b += step)
          tasks.push_back({i, b, std::min(it.nbytes, b + step)});
    } else {
      for_each_tile(it.region, it.tiles, [&](const box& t) { tiles[i].push_back(t); });
      it.checksums.assign(tiles[i].size(), 0);
    }
    it.block_offsets.assign(compressed_item ? it.checksums.size() : 0, 0);
    it.block_stored.assign(compressed_item ? it.checksums.size() : 0, 0);
    if (it.tiles.empty()) continue;
    std::uint64_t pos = 0;
    task cur{i, 0, 0, 0, 0};
    for (std::size_t k = 0; k < tiles[i].size(); ++k) {
      std::uint64_t n = static_cast<std::uint64_t>(tiles[i][k].volume()) * it.elem_size;
      if (cur.last_tile > cur.first_tile && cur.end - cur.begin + n > gather_bytes) {
        tasks.push_back(cur);
        cur = task{i, pos, pos, k, k};
      }
      pos += n;
      cur.end = pos;
      cur.last_tile = k + 1;
    }
    if (cur.last_tile > cur.first_tile) tasks.push_back(cur);
  }
  std::atomic<std::uint64_t> cursor{0};  // compressed writes: the object's end
  // Compresses blocks [first, first + n) of `it` (block q: `len(q)` bytes at `at(q)`) one by
  // one (a block that does not shrink stays raw), appends them to the object as one run and
  // records where each went.
  auto compress_and_append = [&](write_item& it, std::size_t first, std::size_t n, auto&& at,
                                 auto&& len) -> result<void> {
    std::unique_ptr<std::byte[]> out(new std::byte[n * ZSTD_compressBound(block_size)]);
    std::unique_ptr<ZSTD_CCtx, std::size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    std::uint64_t used = 0;
    for (std::size_t q = 0; q < n; ++q) {
      const std::byte* src = at(q);
      std::uint64_t l = len(q);
      std::size_t c = ZSTD_compressCCtx(cctx.get(), out.get() + used, ZSTD_compressBound(l), src, l,
                                        zstd_level);
      if (ZSTD_isError(c))
        return std::move(make_error(errc::io, std::string("zstd: ") + ZSTD_getErrorName(c)))
            .with_key(it.key);
      if (c >= l) {
        std::memcpy(out.get() + used, src, l);
        c = l;
      }
      it.block_stored[first + q] = c;
      used += c;
    }
    std::uint64_t pos = cursor.fetch_add(used);
    for (std::size_t q = 0; q < n; ++q) {
      it.block_offsets[first + q] = pos;
      pos += it.block_stored[first + q];
    }
    return writer->write_at(pos - used, {out.get(), static_cast<std::size_t>(used)});
  };
  auto r = run_parallel(tasks.size(), threads, [&](std::size_t k) -> result<void> {
    const task& t = tasks[k];
    write_item& it = items[t.item];
    if (it.tiles.empty()) {
      for (std::uint64_t b = t.begin; b < t.end; b += block_size)
        it.checksums[b / block_size] =
            checksum({it.src + b, static_cast<std::size_t>(std::min(block_size, it.nbytes - b))});
      result<void> w = ok();
      if (!compress) {
        w = writer->write_at(it.file_offset + t.begin,
                             {it.src + t.begin, static_cast<std::size_t>(t.end - t.begin)});
      } else if (it.is_object) {  // objects are stored raw, in one run
        it.file_offset = cursor.fetch_add(it.nbytes);
        w = writer->write_at(it.file_offset, {it.src, static_cast<std::size_t>(it.nbytes)});
      } else {
        std::size_t first = static_cast<std::size_t>(t.begin / block_size);
        std::size_t n = static_cast<std::size_t>((t.end - t.begin + block_size - 1) / block_size);
        w = compress_and_append(
            it, first, n, [&](std::size_t q) { return it.src + t.begin + q * block_size; },
            [&](std::size_t q) { return std::min(block_size, t.end - t.begin - q * block_size); });
      }
      if (!w) return std::move(w).err().with_key(it.key);
      return ok();
    }
    std::unique_ptr<std::byte[]> buf = buffers->take();
    std::uint64_t off = 0;
    const std::size_t es = it.elem_size;
    std::vector<std::uint64_t> starts;
    for (std::size_t j = t.first_tile; j < t.last_tile; ++j) {
      const box& tile = tiles[t.item][j];
      std::byte* dst = buf.get() + off;
      for_each_run(it.region, tile, tile, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
        std::memcpy(dst + static_cast<std::uint64_t>(d) * es,
                    it.src + static_cast<std::uint64_t>(s) * es, static_cast<std::size_t>(n) * es);
      });
      std::uint64_t n = static_cast<std::uint64_t>(tile.volume()) * es;
      it.checksums[j] = checksum({dst, static_cast<std::size_t>(n)});
      starts.push_back(off);
      off += n;
    }
    const std::size_t n = t.last_tile - t.first_tile;
    result<void> w =
        compress ? compress_and_append(
                       it, t.first_tile, n, [&](std::size_t q) { return buf.get() + starts[q]; },
                       [&](std::size_t q) { return (q + 1 < n ? starts[q + 1] : off) - starts[q]; })
                 : writer->write_at(it.file_offset + t.begin,
                                    {buf.get(), static_cast<std::size_t>(off)});
    buffers->give(std::move(buf));
    if (!w) return std::move(w).err().with_key(it.key);
    return ok();
  });
  if (!r) return std::move(r).err().with_file(st.describe(name));
  auto f = writer->finish();
  if (!f) return std::move(f).err().with_file(st.describe(name));
  // Storage must now hold the whole object: a backend that reported a short write or an
  // unfinished object as done is caught here, before the commit, not by a later load.
  std::uint64_t expected = cursor.load();
  if (!compress)
    for (const auto& it : items) expected = std::max(expected, it.file_offset + it.nbytes);
  auto held = st.size(name);
  if (!held) return std::move(held).err().with_file(st.describe(name));
  if (*held != expected)
    return std::move(make_error(errc::io, "storage holds " + std::to_string(*held) +
                                              " bytes after " + std::to_string(expected) +
                                              " were written and reported done"))
        .with_file(st.describe(name));
  if (compress) {
    for (auto& it : items) {
      if (!it.block_offsets.empty())
        it.file_offset = it.block_offsets.front();
      else if (it.nbytes == 0)
        it.file_offset = 0;
    }
  }
  if (file_size) *file_size = cursor.load();
  return ok();
}

/// Removes data and common files of earlier saves that the committed metadata no longer
/// references. Best effort: failures leave garbage, never harm the checkpoint.
inline void remove_unreferenced(storage_ref st, const checkpoint_metadata& m) {
  auto names = st.list("");
  if (!names) return;
  for (const auto& n : *names) {
    bool ours = n.find('/') == std::string::npos &&
                (n.rfind("data.", 0) == 0 || n.rfind("common.", 0) == 0) && n.size() > 6 &&
                n.substr(n.size() - 6) == ".cairn";
    if (!ours) continue;
    bool referenced = std::any_of(m.files.begin(), m.files.end(),
                                  [&](const file_record& f) { return f.name == n; });
    if (!referenced) (void)st.remove(n);
  }
}

/// A hash of what a rank's description says about structure and sharding (not its status,
/// save id or common values).
inline std::uint64_t structure_hash(const rank_desc& d) {
  rank_desc s;
  s.tensors = d.tensors;
  s.objects = d.objects;
  for (const auto& c : d.commons) s.commons.push_back(common_desc{c.path, 0});
  return checksum(encode(s));
}

/// Gives a cached layout the file names of a new save id.
inline void rename_save(save_layout& layout, const std::string& save_id) {
  layout.metadata.save_id = save_id;
  for (auto& f : layout.metadata.files) f.name = data_file_name(f.rank, save_id);
}

/// save_leaves' access to save_plan_cache.
struct plan_cache_access {
  static bool usable(const save_plan_cache& c, int world, const save_options& o) {
    return c.valid_ && c.world_ == world && c.block_size_ == o.block_size &&
           c.balance_min_bytes_ == o.balance_min_bytes && c.tile_ == o.tile &&
           c.strategy_ == static_cast<const void*>(o.strategy) &&
           (c.validated_ || !o.validate_access_integrity);
  }
  static const std::vector<std::uint64_t>& structure(const save_plan_cache& c) {
    return c.structure_;
  }
  static save_layout hit(save_plan_cache& c) {
    ++c.hits_;
    return c.layout_;
  }
  static void store(save_plan_cache& c,
                    int world,
                    const save_options& o,
                    std::vector<std::uint64_t> structure,
                    const save_layout& layout) {
    ++c.misses_;
    c.valid_ = true;
    c.world_ = world;
    c.block_size_ = o.block_size;
    c.balance_min_bytes_ = o.balance_min_bytes;
    c.tile_ = o.tile;
    c.strategy_ = o.strategy;
    c.validated_ = o.validate_access_integrity;
    c.structure_ = std::move(structure);
    c.layout_ = layout;
  }
};

/// A save after planning: the layout, and what this rank writes where. Tensor items point into
/// the user's memory (or, for an async save, into the staging pool); objects and common values
/// are owned copies.
struct planned_save {
  save_layout layout;
  std::string save_id;
  int rank = 0;
  std::vector<write_item> items;    ///< this rank's data file, in file order
  std::vector<bytes> object_bytes;  ///< encoded main-replica objects, in leaf order
  std::vector<std::pair<std::string, common_value>> commons;
  save_stats stats;
  std::chrono::steady_clock::time_point start;
};

/// What the write phase of one rank leaves for the commit.
struct written_save {
  std::optional<error> failure;
  /// Sent to every rank after the write (native: this rank's checksums), then handed to the
  /// strategy's `assemble` and `commit`.
  bytes report;
  /// Sent to every rank after `assemble`.
  bytes assemble_report;
  /// Whatever the strategy keeps on this rank between phases.
  std::any local;
};

}  // namespace detail

/// A save after planning, as a strategy sees it: the global layout (every tensor's chunks and
/// which rank writes each), and this rank's write items in `layout.slots[rank]` order.
using planned_save = detail::planned_save;
/// What one rank's write left for the commit (its report, strategy state, failure).
using written_save = detail::written_save;

/// A save strategy: how the chunks a save planned become files, and what metadata says where
/// they are. Storage stays separate (any backend works). Planning is shared by every strategy:
/// replicas are deduplicated, writes balanced across ranks, access integrity checked. A
/// strategy then runs three steps:
///
/// 1. `write` (every rank, in parallel, no communication): writes this rank's items and
///    leaves a `report` that every rank receives;
/// 2. `assemble` (optional, every rank, after every write succeeded): a second local pass that
///    may read what other ranks wrote (safetensors builds its files here);
/// 3. `commit` (rank 0, after every rank succeeded): writes the metadata that makes the
///    checkpoint visible, last.
///
/// A failure anywhere reaches every rank; `abandon` then removes what this rank wrote. The
/// built-in strategies are `native_strategy` (here) and, in `cairn/strategies.hpp`,
/// `torch_dist_strategy` and `safetensors_strategy`. Write your own by deriving from this
/// class; an instance must outlive the saves that use it and is shared across threads.
class save_strategy {
 public:
  virtual ~save_strategy() = default;
  /// The strategy's name ("native", "torch_dist", "one_file", ...).
  virtual std::string_view name() const noexcept = 0;
  /// Whether planning cuts chunks larger than `block_size` into tiles (only layouts that
  /// record tiles can hold them).
  virtual bool tiles(const save_options& opt) const noexcept {
    (void)opt;
    return false;
  }
  /// Whether `save_options::overwrite` may replace a committed checkpoint in place.
  virtual bool can_overwrite() const noexcept { return true; }
  /// Checks this rank's leaves before planning (a layout that holds tensors only rejects
  /// objects here). Called on every rank; a failure reaches every rank.
  virtual result<void> check(const leaf_list& leaves) const {
    (void)leaves;
    return ok();
  }
  /// Step 1: writes this rank's items (`plan.items`, in `plan.layout.slots[plan.rank]` order)
  /// and sets `out.report`.
  virtual result<void> write(planned_save& plan,
                             storage_ref st,
                             const save_options& opt,
                             detail::gather_buffers* buffers,
                             written_save& out) const = 0;
  /// Whether step 2 runs.
  virtual bool assembles() const noexcept { return false; }
  /// Step 2, with every rank's write report (indexed by rank); sets `out.assemble_report`.
  virtual result<void> assemble(planned_save& plan,
                                const std::vector<bytes>& reports,
                                storage_ref st,
                                const save_options& opt,
                                written_save& out) const {
    (void)plan, (void)reports, (void)st, (void)opt, (void)out;
    return ok();
  }
  /// Step 3 on rank 0: writes the metadata, last, from every rank's reports.
  virtual result<void> commit(planned_save& plan,
                              written_save& w,
                              const std::vector<bytes>& reports,
                              const std::vector<bytes>& assemble_reports,
                              storage_ref st,
                              const save_options& opt) const = 0;
  /// Removes what this rank wrote for a save that failed (best effort).
  virtual void abandon(const planned_save& plan, const written_save& w, storage_ref st) const {
    (void)plan, (void)w, (void)st;
  }
  /// Called on rank 0 when `commit` failed: whether storage holds this save's commit anyway
  /// (the write happened but its acknowledgement was lost: a dropped server reply, a rename
  /// whose directory fsync failed). `true`: the save is committed after all; `false`: it is
  /// not, and every rank may `abandon` what it wrote; an error: the outcome is unknown, and
  /// nothing is removed (the next successful save removes what is left). The default answers
  /// "unknown", which is always safe.
  virtual result<bool> committed(const planned_save& plan,
                                 const written_save& w,
                                 storage_ref st) const {
    (void)plan, (void)w, (void)st;
    return make_error(errc::io, "the " + std::string(name()) +
                                    " strategy cannot tell whether its commit took effect");
  }
};

namespace detail {

/// A common-state object as written: its name, extent (file index unset) and where each value
/// lies in it.
struct common_state {
  std::string name;
  extent where;
  std::map<std::string, common_record> records;
};

/// Writes `commons` (path -> common_value pairs) into object `name`, checksummed per block.
template <class Commons>
result<common_state> write_common_state(storage_ref st,
                                        std::string name,
                                        const Commons& commons,
                                        std::uint64_t block_size) {
  common_state cs{std::move(name), {}, {}};
  bytes buf;
  for (const auto& [path, v] : commons) {
    cs.records[path] = common_record{v.kind, v.type, buf.size(), v.data.size()};
    buf.insert(buf.end(), v.data.begin(), v.data.end());
  }
  cs.where.nbytes = buf.size();
  cs.where.checksums = block_checksums(buf, block_size);
  if (auto w = st.put(cs.name, buf); !w) return std::move(w).err().with_file(st.describe(cs.name));
  return cs;
}

/// Records a written common state in `m`, its file last.
inline void add_common_state(checkpoint_metadata& m, common_state cs) {
  cs.where.file = static_cast<std::uint32_t>(m.files.size());
  m.files.push_back(file_record{cs.name, 0, cs.where.nbytes});
  m.common = std::move(cs.where);
  m.commons = std::move(cs.records);
}

/// Puts a commit object and checks that storage holds all of it afterwards (one `size` call): a
/// backend that reports success for a short write (a lying disk) gets one more `put`; if the
/// object is still wrong, the commit fails (and `save_strategy::committed` decides what that
/// means).
inline result<void> put_checked(storage_ref st,
                                std::string_view name,
                                std::span<const std::byte> data) {
  for (int attempt = 0;; ++attempt) {
    if (auto p = st.put(name, data); !p) return std::move(p).err().with_file(st.describe(name));
    CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(name));
    if (n == data.size()) return ok();
    if (attempt > 0)
      return std::move(make_error(errc::io, "storage reported the write of " +
                                                std::to_string(data.size()) +
                                                " bytes as done, but holds " + std::to_string(n)))
          .with_file(st.describe(name));
  }
}

/// The commit of a native checkpoint: `metadata.json`, written atomically, after checking that
/// this reader loads it back.
inline result<void> put_metadata(storage_ref st, const checkpoint_metadata& m) {
  std::string json = to_json(m);
  CAIRN_TRY(metadata_from_json(json, st.describe(metadata_name)));
  return put_checked(st, metadata_name, std::as_bytes(std::span(json)));
}

}  // namespace detail

/// cairn's own format (docs/format.md): one data file per writing rank, chunks tiled into
/// checksum blocks, `metadata.json` written last by rank 0. The default strategy.
class native_strategy final : public save_strategy {
 public:
  std::string_view name() const noexcept override { return "native"; }
  bool tiles(const save_options& opt) const noexcept override { return opt.tile; }
  result<void> write(planned_save& plan,
                     storage_ref st,
                     const save_options& opt,
                     detail::gather_buffers* buffers,
                     written_save& out) const override {
    const int rank = plan.rank;
    const save_layout& layout = plan.layout;
    std::uint64_t file_size = 0;
    if (layout.file_of_rank[rank] >= 0) {
      const std::string& name = layout.metadata.files[layout.file_of_rank[rank]].name;
      CAIRN_TRY(detail::write_items(st, name, plan.items, opt.block_size, opt.io_threads, buffers,
                                    opt.zstd_level, &file_size));
      for (const auto& it : plan.items) plan.stats.bytes_written += it.nbytes;
      plan.stats.chunks_written = plan.items.size();
    }
    detail::binary_writer sums;
    sums.u8(opt.zstd_level > 0);
    sums.u64(file_size);
    for (const auto& it : plan.items) {
      sums.u64s(it.checksums);
      if (opt.zstd_level > 0) {
        sums.u64(it.file_offset);
        sums.u64s(it.block_offsets);
        sums.u64s(it.block_stored);
      }
    }
    out.report = std::move(sums.data());
    if (rank == 0 && !plan.commons.empty()) {
      CAIRN_TRY_ASSIGN(detail::common_state cs,
                       detail::write_common_state(st, common_file_name(plan.save_id), plan.commons,
                                                  opt.block_size));
      out.local = std::move(cs);
    }
    return ok();
  }
  result<void> commit(planned_save& plan,
                      written_save& w,
                      const std::vector<bytes>& reports,
                      const std::vector<bytes>&,
                      storage_ref st,
                      const save_options& opt) const override {
    save_layout& layout = plan.layout;
    apply_reports(layout, reports);
    checkpoint_metadata& m = layout.metadata;
    m.content_metadata = opt.content_metadata;
    if (const auto* cs = std::any_cast<detail::common_state>(&w.local))
      detail::add_common_state(m, *cs);  // a copy: abandon still needs its name
    CAIRN_TRY(detail::put_metadata(st, m));
    detail::remove_unreferenced(st, m);
    return ok();
  }
  /// Puts what every rank's write reported (checksums; for compressed saves also where each
  /// block went and the file sizes) into the planned layout.
  static void apply_reports(save_layout& layout, const std::vector<bytes>& reports) {
    for (std::size_t r = 0; r < reports.size(); ++r) {
      detail::binary_reader rd(reports[r]);
      bool compressed = rd.u8();
      std::uint64_t file_size = rd.u64();
      for (const auto& s : layout.slots[r]) {
        extent& e = layout.where(s);
        e.checksums = rd.u64s();
        if (compressed) {
          e.byte_offset = rd.u64();
          e.block_offsets = rd.u64s();
          e.block_stored = rd.u64s();
          if (e.compressed()) layout.metadata.version = 3;
        }
      }
      if (compressed && layout.file_of_rank[r] >= 0)
        layout.metadata.files[layout.file_of_rank[r]].nbytes = file_size;
    }
  }
  void abandon(const planned_save& plan, const written_save& w, storage_ref st) const override {
    const save_layout& layout = plan.layout;
    if (layout.file_of_rank[plan.rank] >= 0)
      (void)st.remove(layout.metadata.files[layout.file_of_rank[plan.rank]].name);
    // Rank 0's common state, also when its put failed after all (a lost acknowledgement).
    if (const auto* cs = std::any_cast<detail::common_state>(&w.local))
      (void)st.remove(cs->name);
    else if (plan.rank == 0 && !plan.commons.empty())
      (void)st.remove(common_file_name(plan.save_id));
  }
  /// Committed when `metadata.json` is there and names this save's id.
  result<bool> committed(const planned_save& plan,
                         const written_save&,
                         storage_ref st) const override {
    CAIRN_TRY_ASSIGN(bool present, st.exists(metadata_name));
    if (!present) return false;
    CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_metadata(st));
    return m.save_id == plan.save_id;
  }
};

namespace detail {

/// The strategy of a save (the native one when none is set).
inline const save_strategy& strategy_of(const save_options& opt) {
  static const native_strategy native;
  return opt.strategy ? *opt.strategy : native;
}

/// Phase 1 of a save (collective): describe this rank's leaves, agree on the plan (or reuse
/// the cached one), and list this rank's write items. Fails on every rank alike.
inline result<void> plan_phase(const leaf_list& leaves,
                               storage_ref st,
                               comm_ref comm,
                               const save_options& opt,
                               planned_save& out,
                               const std::optional<error>& local_failure = std::nullopt) {
  out.start = std::chrono::steady_clock::now();
  const int rank = comm.rank();
  out.rank = rank;
  save_stats& stats = out.stats;
  stats = save_stats{};
  if (opt.block_size == 0 || opt.block_size > max_block_size)
    return make_error(errc::invalid_argument,
                      "block_size must be between 1 and " + std::to_string(max_block_size));
  if (opt.zstd_level < 0 || opt.zstd_level > ZSTD_maxCLevel())
    return make_error(errc::invalid_argument,
                      "zstd_level must be 0 (off) to " + std::to_string(ZSTD_maxCLevel()));

  // 1. Describe this rank's leaves.
  rank_desc me;
  std::vector<bytes>& object_bytes = out.object_bytes;
  object_bytes.clear();
  std::vector<std::vector<piece>> pieces(leaves.tensors.size());
  std::vector<std::pair<std::string, common_value>>& commons = out.commons;
  commons.clear();
  try {
    if (local_failure) throw exception(*local_failure);  // shared with every rank below
    auto check_utf8 = [](const std::string& s, const char* what) {
      if (!simdjson::validate_utf8(s.data(), s.size()))
        throw exception(
            std::move(make_error(errc::invalid_argument, std::string(what) + " is not valid UTF-8"))
                .with_key(s));
    };
    for (const auto& t : leaves.tensors) check_utf8(t.layout.key, "tensor key");
    for (const auto& o : leaves.objects) check_utf8(o.key, "object key");
    for (const auto& c : leaves.commons) check_utf8(c.path, "common value path");
    for (const auto& [k, v] : opt.content_metadata) {
      check_utf8(k, "content metadata key");
      check_utf8(v, "content metadata value");
    }
    for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
      const tensor_leaf& t = leaves.tensors[i];
      std::size_t es = dtype_size(t.layout.type);
      if (t.nbytes % es != 0)
        throw exception(std::move(make_error(errc::invalid_argument,
                                             "data size is not a multiple of the element size"))
                            .with_key(t.layout.key));
      if (auto v = validate_layout(t.layout, t.nbytes / es); !v)
        throw exception(std::move(v).err());
      pieces[i] = pieces_of(t.layout);
      tensor_desc d{t.layout.key, t.layout.type, t.layout.global_shape, t.layout.replica_id, {}};
      for (const auto& p : pieces[i]) d.pieces.push_back(p.region);
      me.tensors.push_back(std::move(d));
    }
    for (const auto& o : leaves.objects) {
      bytes b = o.replica_id == 0 ? o.encode(o.value) : bytes{};
      me.objects.push_back(
          object_desc{o.key, o.global_shape, o.global_offset, o.replica_id, b.size()});
      object_bytes.push_back(std::move(b));
    }
    for (const auto& c : leaves.commons) commons.emplace_back(c.path, c.encode(c.value));
    if (opt.preprocess_common) {
      std::map<std::string, common_value> check(commons.begin(), commons.end());
      opt.preprocess_common(check);
      for (const auto& [path, v] : check) me.commons.push_back(common_desc{path, common_hash(v)});
    } else {
      for (const auto& [path, v] : commons) me.commons.push_back(common_desc{path, common_hash(v)});
    }
    if (auto c = strategy_of(opt).check(leaves); !c) throw exception(std::move(c).err());
    if (rank == 0) {
      // Any committed layout counts: a save never writes over a checkpoint of another kind.
      auto layout = detect_layout(st);
      if (!layout) throw exception(std::move(layout).err());
      me.checkpoint_exists = !layout->empty();
      me.save_id = new_save_id();
    }
  } catch (...) {
    me.failure = current_exception_error("planning the save");
  }

  // 2. Agree on the plan. With a warm plan cache, ranks exchange only hashes; otherwise every
  // rank's description, and everyone plans the same layout.
  std::uint64_t structure = structure_hash(me);
  std::uint64_t commons_digest = 0;
  for (const auto& c : me.commons) commons_digest = commons_digest * 1099511628211ull ^ c.hash;
  std::optional<save_layout> cached;
  bool exists_at_root = false;
  std::string save_id;
  save_plan_cache* cache = opt.plan_cache;
  if (cache && plan_cache_access::usable(*cache, comm.size(), opt)) {
    binary_writer w;
    put_error(w, me.failure);
    w.u8(me.checkpoint_exists);
    w.str(me.save_id);
    w.u64(structure);
    w.u64(commons_digest);
    std::vector<std::optional<error>> st0;
    bool same = true;
    std::uint64_t digest0 = 0;
    auto msgs = comm.all_gather(w.data());
    for (std::size_t r = 0; r < msgs.size(); ++r) {
      binary_reader rd(msgs[r]);
      st0.push_back(get_error(rd));
      bool ex = rd.u8();
      std::string id = rd.str();
      std::uint64_t h = rd.u64(), d = rd.u64();
      if (r == 0) exists_at_root = ex, save_id = id, digest0 = d;
      same = same && h == plan_cache_access::structure(*cache)[r] &&
             (!opt.validate_access_integrity || d == digest0);
    }
    if (auto f = first_failure(st0)) return std::move(*f);
    if (same) cached = plan_cache_access::hit(*cache);
  }
  std::vector<rank_desc> all;
  if (!cached) {
    for (const auto& b : comm.all_gather(encode(me))) all.push_back(decode_rank_desc(b));
    std::vector<std::optional<error>> st0;
    for (const auto& d : all) st0.push_back(d.failure);
    if (auto f = first_failure(st0)) return std::move(*f);
    exists_at_root = all[0].checkpoint_exists;
    save_id = all[0].save_id;
  }
  if (exists_at_root && !opt.overwrite)
    return std::move(make_error(errc::already_exists,
                                "a committed checkpoint already exists here; pass "
                                "save_options{.overwrite = true} to replace it"))
        .with_file(st.describe(metadata_name));
  if (exists_at_root && !strategy_of(opt).can_overwrite())
    return std::move(make_error(errc::already_exists,
                                "a committed checkpoint already exists here and the " +
                                    std::string(strategy_of(opt).name()) +
                                    " strategy cannot replace one in place (its file names are "
                                    "fixed); save to a new place"))
        .with_file(st.describe(""));
  if (cached) {
    // validated when it was planned; common values were compared through their digests
  } else if (opt.validate_access_integrity) {
    if (auto v = validate_integrity(all); !v) return std::move(v).err();
  } else {
    // Even unvalidated, two ranks must not both write one object: one record would be lost.
    std::map<std::string, int> owner;
    for (int r = 0; r < static_cast<int>(all.size()); ++r)
      for (const auto& o : all[r].objects)
        if (o.replica_id == 0)
          if (auto [it, fresh] =
                  owner.try_emplace(object_unique_key(o.key, o.global_offset, o.global_shape), r);
              !fresh)
            return std::move(make_error(errc::integrity, "sharded object " + it->first +
                                                             " is saved by rank " +
                                                             std::to_string(it->second) +
                                                             " and rank " + std::to_string(r)))
                .with_key(o.key);
  }
  stats.save_id = save_id;
  save_layout& layout = out.layout;
  if (cached) {
    layout = std::move(*cached);
    rename_save(layout, save_id);
    stats.plan_reused = true;
  } else {
    layout =
        plan_save(all, save_id, opt.block_size, opt.balance_min_bytes, strategy_of(opt).tiles(opt));
    if (cache) {
      std::vector<std::uint64_t> per_rank;
      for (const auto& d : all) per_rank.push_back(structure_hash(d));
      plan_cache_access::store(*cache, comm.size(), opt, std::move(per_rank), layout);
    }
  }
  stats.bytes_per_rank = layout.bytes_of_rank;
  out.save_id = save_id;

  // 3. This rank's items, in file order.
  std::vector<write_item>& items = out.items;
  items.clear();
  for (const write_slot& slot : layout.slots[rank]) {
    const extent& e = layout.where(slot);
    if (slot.is_object) {
      items.push_back({object_bytes[slot.leaf].data(),
                       e.nbytes,
                       e.byte_offset,
                       leaves.objects[slot.leaf].key,
                       {},
                       {},
                       {},
                       1,
                       true});
    } else {
      const tensor_leaf& t = leaves.tensors[slot.leaf];
      std::size_t es = dtype_size(t.layout.type);
      const piece& p = pieces[slot.leaf][slot.piece];
      const chunk_record& c = layout.metadata.tensors.at(slot.key).chunks.at(slot.chunk);
      items.push_back({t.data + (p.data_offset + slot.element) * es,
                       e.nbytes,
                       e.byte_offset,
                       t.layout.key,
                       {},
                       c.region,
                       c.tiles,
                       es});
    }
  }
  return ok();
}

/// Phase 2 of a save (local, no communication): the strategy writes this rank's part.
/// Failures are returned for the commit to share; this rank's files are removed.
inline written_save write_phase(planned_save& plan,
                                storage_ref st,
                                const save_options& opt,
                                gather_buffers* buffers = nullptr) {
  written_save out;
  const save_strategy& strategy = strategy_of(opt);
  try {
    if (auto w = strategy.write(plan, st, opt, buffers, out); !w) out.failure = std::move(w).err();
  } catch (...) {
    out.failure = current_exception_error("writing the save");
  }
  if (out.failure) {
    if (out.failure->rank < 0) out.failure->rank = plan.rank;
    strategy.abandon(plan, out, st);
  }
  return out;
}

/// Phase 3 of a save (collective): share every rank's status and report; let the strategy
/// assemble (when it does) and share again; when all succeeded, rank 0 commits (metadata
/// last) and tells everyone how that went.
inline result<save_stats> commit_phase(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt) {
  const int rank = plan.rank;
  const save_strategy& strategy = strategy_of(opt);
  auto exchanged = exchange_status(comm, w.failure, w.report);  // not bound: lambdas use them
  const auto& status = exchanged.first;
  const auto& reports = exchanged.second;
  if (auto f = first_failure(status)) {
    // The save failed somewhere: this save's files are garbage; the previous checkpoint (if
    // any) is untouched because its metadata was not replaced.
    if (!w.failure) strategy.abandon(plan, w, st);
    return std::move(*f);
  }
  std::vector<bytes> assembled;
  if (strategy.assembles()) {
    std::optional<error> failure;
    try {
      if (auto a = strategy.assemble(plan, reports, st, opt, w); !a) failure = std::move(a).err();
    } catch (...) {
      failure = current_exception_error("assembling the save");
    }
    if (failure && failure->rank < 0) failure->rank = rank;
    auto [status2, payloads2] = exchange_status(comm, failure, w.assemble_report);
    if (auto f = first_failure(status2)) {
      strategy.abandon(plan, w, st);
      return std::move(*f);
    }
    assembled = std::move(payloads2);
  }
  // Rank 0 commits. A failed commit may still have happened (a lost acknowledgement): read
  // storage back before anyone removes anything; when even that fails, remove nothing.
  std::optional<error> commit_failure;
  bool outcome_unknown = false;
  if (rank == 0) {
    auto c = catch_all("committing the save",
                       [&] { return strategy.commit(plan, w, reports, assembled, st, opt); });
    if (!c) {
      auto done =
          catch_all("reading the commit back", [&] { return strategy.committed(plan, w, st); });
      if (done && *done) {
        // Committed after all. Files of a replaced checkpoint stay until the next save: the
        // commit may not be durable yet.
      } else if (done) {
        commit_failure = std::move(c).err();
      } else {
        outcome_unknown = true;
        commit_failure = std::move(c).err();
        commit_failure->message += "; whether the commit took effect is unknown (" +
                                   done.err().describe() +
                                   "), so nothing was removed: the next save cleans up";
      }
    } else {
      // Temporary objects of puts that never finished (killed processes): every put of this
      // save is done, so any left under the root are garbage.
      (void)st.remove_temporaries("");
    }
  }
  binary_writer cw;
  put_error(cw, commit_failure);
  cw.u8(outcome_unknown);
  bytes commit = std::move(cw.data());
  comm.broadcast(commit, 0);
  binary_reader cr(commit);
  if (auto f = get_error(cr)) {
    if (!cr.u8()) strategy.abandon(plan, w, st);
    return std::move(*f).with_rank(0);
  }
  save_stats& stats = plan.stats;
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - plan.start).count();
  return stats;
}

/// The non-template body of `save`: plan across ranks, write, commit.
inline result<save_stats> save_leaves(const leaf_list& leaves,
                                      storage_ref st,
                                      comm_ref comm,
                                      const save_options& opt) {
  // Tensors in device memory are copied to pinned host memory first (a no-op without a device).
  leaf_list host_leaves = leaves;
  device_leaf_staging device;
  std::optional<error> staging_failure;
  if (auto r = device.to_host(host_leaves, opt.cuda_runtime); !r)
    staging_failure = std::move(r).err();
  planned_save plan;
  CAIRN_TRY(plan_phase(host_leaves, st, comm, opt, plan, staging_failure));
  written_save w = write_phase(plan, st, opt);
  return commit_phase(plan, w, st, comm, opt);
}

}  // namespace detail

/// Saves `tree` from this rank; every rank of `comm` calls it with its own shards. Returns
/// this rank's statistics or the first error any rank hit (the same error on every rank).
/// The checkpoint is committed (metadata.json written last, atomically) only when every rank
/// succeeded; a failed save leaves any previous checkpoint in `st` loadable.
template <class Tree>
result<save_stats> try_save(const Tree& tree,
                            storage_ref st,
                            comm_ref comm,
                            const save_options& opt = {}) {
  // Visiting needs non-const access to build leaf views; save never writes through them.
  try {
    leaf_list leaves = flatten(const_cast<Tree&>(tree));
    return detail::save_leaves(leaves, st, comm, opt);
  } catch (...) {
    return detail::current_exception_error("saving").with_rank(comm.rank());
  }
}

/// Throwing form of `try_save`: returns statistics or throws `cairn::exception`.
template <class Tree>
save_stats save(const Tree& tree, storage_ref st, comm_ref comm, const save_options& opt = {}) {
  return try_save(tree, st, comm, opt).value();
}

}  // namespace cairn
