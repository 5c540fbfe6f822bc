// cairn/options.hpp: what a caller can ask of `save` and `load` (options, strict modes) and
// what they report back (statistics).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/plan/index.hpp"

namespace cairn {

namespace cuda {
struct runtime_api;
class staging_pool;
}  // namespace cuda

/// The staging window of a synchronous save of device tensors when neither
/// `save_options::staging_window` nor an allocated shared pool sets one (bytes).
inline constexpr std::uint64_t default_staging_window = std::uint64_t{256} << 20;

class save_plan_cache;
class load_plan_cache;
class save_strategy;

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
  /// one per holder at most, so that every rank writes about the same amount. The default (one
  /// checksum block, 1 MiB) keeps reads large and the index small: at 4096 ranks (TP 8 x PP 4 x
  /// DP 128) a rank loading a replicated 4 MiB block reads 4 parts and their index entries
  /// instead of 64, for a slowest writer 3% above the mean instead of 0.3% (docs/benchmarks.md).
  std::uint64_t balance_min_bytes = std::uint64_t{1} << 20;
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
  /// Check across ranks that shards tile each tensor exactly and that the ranks declaring a
  /// common value agree on it.
  bool validate_access_integrity = true;
  /// Edits a copy of this rank's common values (by path) before they are compared across
  /// ranks (Megatron's preprocess_common_before_consistancy_check): drop or normalize values
  /// that may legitimately differ. What is saved is the unedited values of rank 0 (of a value
  /// held by a group of ranks: of its lowest rank).
  std::function<void(std::map<std::string, common_value>&)> preprocess_common;
  /// Reuse the plan of the previous save made with this cache when nothing changed.
  save_plan_cache* plan_cache = nullptr;
  /// How a save plans when no cached plan serves it. By key owners (`true`, plan/scalable.hpp):
  /// each rank sends each key's owner only its leaves of that key and receives only its own
  /// slots, so that no rank receives every rank's description; needs a strategy that
  /// `plans_at_scale` (native). Everywhere (`false`): every rank's description goes to every
  /// rank (one all-gather) and each plans the whole job, which is quicker for a few ranks.
  /// Unset, the default: by key owners when the strategy plans at scale and the world has at
  /// least `key_owner_planning_min_ranks` ranks, else everywhere (`plans_by_key_owners`).
  /// Without `index_files`, rank 0 still receives every rank's index at the commit (the format
  /// then keeps one metadata file).
  std::optional<bool> scalable_planning;
  /// Write format version 4 (native strategy): each key's owner (the same hash of the key as
  /// `scalable_planning`) receives the chunk records of its keys from their writers and writes
  /// them to its binary index file (`index.<rank>.<id>.cairn`); `metadata.json` keeps one line
  /// per tensor (dtype, shape, where its index section is, checksummed), so rank 0 receives
  /// O(tensors + ranks) at the commit and a loading rank reads only the sections it needs.
  /// The default. Off: format version 3 (one `metadata.json` holding every chunk, gathered
  /// on rank 0), for readers before version 4, which cannot read the result.
  bool index_files = true;
  /// A string map saved with the checkpoint, readable alone with `read_content_metadata`.
  std::map<std::string, std::string> content_metadata;
  /// The CUDA runtime used to copy tensors that live in device memory into pinned host memory
  /// before writing (null: the default runtime, the real one in `cairn::cuda` builds). Without
  /// a usable device every tensor is host memory.
  const cuda::runtime_api* cuda_runtime = nullptr;
  /// Host staging memory for tensors in device memory, owned by the caller and reused by every
  /// save, load and `async_saver` given it (pinned memory is allocated once, when a save first
  /// needs it, and again only when one needs more). Null: a pool private to the call, allocated
  /// and freed by it. Unused without device tensors.
  cuda::staging_pool* staging = nullptr;
  /// The most host staging memory (bytes) a synchronous save of tensors in device memory uses
  /// at once: the writer copies them piece by piece through a window of this size instead of
  /// staging the rank's whole device state (native, torch_dist and safetensors strategies; a
  /// strategy of your own that does not declare `reads_device_items` gets the whole state
  /// staged first). 0, the default: the capacity of `staging` when it has been allocated, else
  /// `default_staging_window`; never more than the rank's device tensors need. At least one
  /// checksum block (`block_size`) when set.
  std::uint64_t staging_window = 0;
  /// The format the checkpoint is written in (null: cairn's native format). See
  /// `cairn/strategies.hpp` for torch_dist (PyTorch DCP) and the safetensors formats, and
  /// `save_strategy` to write your own. Every rank must pass the same strategy.
  const save_strategy* strategy = nullptr;
  /// Told how much of this rank's data is written ("write"; the safetensors strategies also
  /// "assemble"). For an async save, from its background thread.
  progress_callback progress;
};

/// What one rank did during a save.
struct save_stats {
  std::string save_id;                        ///< the id in this save's file names
  std::uint64_t bytes_written = 0;            ///< data bytes this rank wrote
  std::size_t chunks_written = 0;             ///< tensor chunks and objects this rank wrote
  std::vector<std::uint64_t> bytes_per_rank;  ///< data bytes every rank wrote (the plan)
  bool plan_reused = false;                   ///< the plan came from the save_plan_cache
  double seconds = 0;
  /// The objects this rank wrote (puts and finished writers) that are part of the checkpoint,
  /// in the order they were finished: its data and index files; on rank 0 also the common
  /// state and, last, the metadata (Composer's list of saved files). Names are relative to the
  /// storage the save was given.
  std::vector<std::string> files;
};

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
  /// Host staging memory for tensors in device memory (see `save_options::staging`). Null: a
  /// pool private to the call.
  cuda::staging_pool* staging = nullptr;
  /// Convert between floating dtypes (f16, bf16, f32, f64) where the checkpoint's differs from
  /// the tree's: a bf16 checkpoint loads into an fp32 model and back (narrowing rounds to
  /// nearest even). The keys converted are listed in `load_stats::cast`. Off, the default: a
  /// dtype difference is an error naming the key (cairn never converts silently).
  bool cast_floats = false;
  /// The most host staging memory (bytes) a load into device tensors uses at once: what is
  /// read goes to the device piece by piece through a window of this size. 0, the default: the
  /// capacity of `staging` when it has been allocated, else `default_staging_window`; never
  /// more than the rank's device tensors need.
  std::uint64_t staging_window = 0;
  /// A tensor piece that several ranks ask for alike (data-parallel replicas of a
  /// tensor-parallel shard, a tensor every rank holds whole) is read from storage by one of them
  /// and passed on to the others through the communicator, along a binomial tree (log2 of the
  /// group's size rounds), instead of being read by each: storage serves it once (it matters
  /// most for object stores and shared filesystems). Pieces smaller than `broadcast_min_bytes`
  /// are read by every rank that wants them. Planning costs two all_to_all exchanges through the
  /// pieces' owners, in which a rank receives the claims on the pieces it owns and a route per
  /// shared piece it wants (never every rank's requests), and one 9-byte all_gather; see
  /// cairn/pipeline/share.hpp.
  bool read_once_broadcast = true;
  std::uint64_t broadcast_min_bytes = std::uint64_t{64} << 10;
  /// The most bytes a rank sends one other rank in one step of passing shared pieces on (an
  /// all_to_all each): the bound on the buffers of that exchange, per peer.
  std::uint64_t share_step_bytes = std::uint64_t{4} << 20;
  /// When set, filled on every rank with the checkpoint's common values that this load does
  /// not put into the tree (DeepSpeed's `client_state`, the kwargs ColossalAI returns): paths
  /// the tree does not declare, and those left out by `ignore_keys`, `edit_keys` or a preset
  /// (`with_preset`). Decode them with `common_value::as<T>()`.
  std::map<std::string, common_value>* client_state = nullptr;
  /// When set, filled on every rank with the checkpoint's sharded objects that this load does
  /// not put into the tree: keys the tree does not declare, and those left out by
  /// `ignore_keys`, `edit_keys` or a preset. By unique key (`object_unique_key`:
  /// `rng/shard_1_4`, the object at position 1 of a grid of 4), as the bytes the object was
  /// saved as (what its `encode` wrote; a `byte_object`'s bytes as they were). Every rank reads
  /// every such object; not with `common_only`.
  std::map<std::string, bytes>* client_objects = nullptr;
  /// Told how much of the tensor data this rank reads from storage is read ("read").
  progress_callback progress;
  /// Reuse what the previous load made with this cache read of the same checkpoint's index
  /// files when it asks for the same boxes (cairn/pipeline/load_cache.hpp). The checkpointer
  /// sets its own unless one is given.
  load_plan_cache* plan_cache = nullptr;
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
  std::uint64_t bytes_read = 0;  ///< bytes read from storage (whole checksum blocks)
  /// Bytes of format version 4 index files read (ends, directories and pages meeting this
  /// rank's pieces); the manifest, which rank 0 reads and broadcasts, is in neither count.
  std::uint64_t index_bytes_read = 0;
  std::uint64_t bytes_needed = 0;  ///< bytes of the target that came from the checkpoint
  /// Bytes of shared pieces this rank received from other ranks instead of reading them.
  std::uint64_t bytes_from_ranks = 0;
  /// Bytes of shared pieces this rank passed on to other ranks.
  std::uint64_t bytes_to_ranks = 0;
  /// Tree keys whose saved floating dtype was converted to the tree's
  /// (`load_options::cast_floats`), in leaf order.
  std::vector<std::string> cast;
  double seconds = 0;
  std::vector<std::string> unexpected;  ///< tree keys not in the checkpoint (skipped)
  std::vector<std::string> missing;     ///< checkpoint keys no rank asked for (*_all modes)
  /// The index chunks came from `load_options::plan_cache`: no index file was read.
  bool index_reused = false;
};

}  // namespace cairn
