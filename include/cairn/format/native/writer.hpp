// cairn/format/native/writer.hpp: writing the native format: the block writer (data files,
// checksummed per block or tile, raw or zstd-compressed), the common-state file, the commit of
// `metadata.json`, and the removal of files no committed metadata references.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/checksum.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::detail {

/// One unit of the block writer's work: bytes [begin, end) of item `item` (block aligned at
/// `begin`), or for a tiled item the tiles [first_tile, last_tile), gathered into one buffer.
struct write_task {
  std::size_t item;
  std::uint64_t begin, end;
  std::size_t first_tile = 0, last_tile = 0;
};

/// Cuts items into tasks of about `io_bytes` (whole blocks), or for tiled items runs of tiles
/// that fit one gather buffer; sizes every item's checksum list (and, compressed, its block
/// offsets and stored lengths). `tiles[i]` receives item i's tiles in order. Tasks of items in
/// device memory hold at most `device_piece` bytes (one staging window slot, whole blocks).
CAIRN_INLINE std::vector<write_task> plan_write_tasks(std::vector<write_item>& items,
                                                      std::vector<std::vector<box>>& tiles,
                                                      std::uint64_t block_size,
                                                      std::uint64_t gather_bytes,
                                                      bool compress,
                                                      std::uint64_t device_piece = 0);

/// Where the block writer's bytes go in one object: raw, at each item's planned offset; or
/// compressed, each block on its own (kept raw when that does not make it smaller), runs
/// appended in task order — whatever order the threads finish in, so the same items give the
/// same bytes. Thread-safe.
class block_sink {
 public:
  block_sink(object_writer& out, std::uint64_t block_size, int zstd_level)
      : out_(out), block_size_(block_size), zstd_level_(zstd_level) {}

  /// Task `ticket`'s place in the append order of a compressed sink. A task appends at most
  /// once; one that ends without appending (nothing to append, or a failure) passes its turn on
  /// when the turn is destroyed, so later tasks never wait for it forever.
  class turn {
   public:
    turn(block_sink& sink, std::size_t ticket) : sink_(sink), ticket_(ticket) {}
    turn(const turn&) = delete;
    turn& operator=(const turn&) = delete;
    ~turn();
    /// Waits for the tasks before this one to append, then reserves `n` bytes at the end of
    /// the object; returns where they start.
    std::uint64_t reserve(std::uint64_t n);

   private:
    block_sink& sink_;
    std::size_t ticket_;
    bool taken_ = false;
  };

  /// Whether blocks are compressed.
  bool compressed() const noexcept { return zstd_level_ > 0; }
  /// Compressed: the object's size so far.
  std::uint64_t end() const;

  /// Writes `data`, which is bytes [at, at + size) of item `it`: raw at its planned place; an
  /// object of a compressed save (stored raw, whole) is appended in `t`'s turn.
  result<void> raw(write_item& it, std::uint64_t at, std::span<const std::byte> data, turn& t);

  /// Compresses blocks [first, first + n) of `it` (block q: `len(q)` bytes at `at(q)`) one by
  /// one, appends them as one run in `t`'s turn and records where each went.
  template <class At, class Len>
  result<void> blocks(
      write_item& it, std::size_t first, std::size_t n, At&& at, Len&& len, turn& t);

 private:
  /// Reserves `n` bytes for task `ticket` once every earlier task has reserved (or passed).
  std::uint64_t reserve(std::size_t ticket, std::uint64_t n);

  object_writer& out_;
  std::uint64_t block_size_;
  int zstd_level_;
  mutable std::mutex mu_;  // guards end_ and next_ticket_
  std::condition_variable turn_cv_;
  std::uint64_t end_ = 0;
  std::size_t next_ticket_ = 0;
};

/// Runs one task of an untiled item: checksums its blocks, then writes them.
CAIRN_INLINE result<void> write_plain_task(const write_task& t,
                                           write_item& it,
                                           std::uint64_t block_size,
                                           block_sink& sink,
                                           block_sink::turn& turn);

/// Runs one task of a tiled item: gathers its tiles (row-major each) into one pooled buffer,
/// checksums each, and writes them as one run.
CAIRN_INLINE result<void> write_tiled_task(const write_task& t,
                                           write_item& it,
                                           const std::vector<box>& tiles,
                                           buffer_pool& buffers,
                                           block_sink& sink,
                                           block_sink::turn& turn);

/// Finishes the object and checks that storage now holds all of it: a backend that reported a
/// short write or an unfinished object as done is caught here, before the commit, not by a
/// later load.
CAIRN_INLINE result<void> finish_object(storage_ref st,
                                        const std::string& name,
                                        object_writer& writer,
                                        std::uint64_t expected);

/// Writes items into one object with `threads` threads, checksumming every block (or tile)
/// first. Tiles are gathered into buffers from `buffers` (a private pool when null), several
/// tiles per write.
///
/// With `zstd_level` > 0, every tensor block (or tile) is compressed on its own (kept raw when
/// that does not make it smaller), and runs of blocks are appended to the object in task
/// order, so the same items give the same bytes: items' `file_offset` is then an output, set with
/// `block_offsets` and `block_stored`; `*file_size` receives the object's size. Objects are stored
/// raw. `progress`, when given, is told each task's item bytes as it is written. Items in device
/// memory (`on_device`) are read through `window` (required then), one slot per task.
CAIRN_INLINE result<void> write_items(storage_ref st,
                                      const std::string& name,
                                      std::vector<write_item>& items,
                                      std::uint64_t block_size,
                                      int threads,
                                      buffer_pool* buffers = nullptr,
                                      int zstd_level = 0,
                                      std::uint64_t* file_size = nullptr,
                                      progress_meter* progress = nullptr,
                                      cuda::staging_window* window = nullptr);

}  // namespace cairn::detail

namespace cairn {

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
CAIRN_INLINE void add_common_state(checkpoint_metadata& m, common_state cs);

/// The commit of a native checkpoint: `metadata.json`, written atomically, after checking that
/// this reader loads it back.
CAIRN_INLINE result<void> put_metadata(storage_ref st, const checkpoint_metadata& m);

}  // namespace cairn

namespace cairn::detail {

/// Removes data and common files of earlier saves that the committed metadata no longer
/// references. Best effort: failures leave garbage, never harm the checkpoint.
CAIRN_INLINE void remove_unreferenced(storage_ref st, const checkpoint_metadata& m);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/writer-inl.hpp"
#endif
