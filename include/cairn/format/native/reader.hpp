// cairn/format/native/reader.hpp: reading the native format: committed metadata, verified byte
// ranges, and whole-checkpoint verification.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/core/checksum.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/index_file.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Largest single read or write cairn issues (bytes).
inline constexpr std::uint64_t max_io_bytes = std::uint64_t{64} << 20;

/// Reads the committed `metadata.json` as it is. Without it, fails as `no_checkpoint_error`
/// says.
CAIRN_INLINE result<std::string> read_metadata_json(storage_ref st);

namespace detail {

/// Why `st` holds no checkpoint, as load, inspect and verify report it: `errc::not_found` when
/// the location does not exist or is empty (a mistyped path), or when it is a folder of
/// checkpoints (a checkpointer's root: the message names the checkpoint its `latest` pointer
/// names, and `checkpointer::load_latest`); else `errc::incomplete_checkpoint` (files, but no
/// committed metadata: a save that never committed, or not a checkpoint). A folder counts as a
/// checkpoint when it holds a name `commits` accepts (the registry's `is_commit_marker`, every
/// format's markers); null: the native `metadata.json` only.
CAIRN_INLINE error no_checkpoint_error(storage_ref st, bool (*commits)(std::string_view) = nullptr);

/// A failed read of object `name` while reading `what` of `key`.
CAIRN_INLINE error read_failed(error err,
                               storage_ref st,
                               const std::string& name,
                               const std::string& key,
                               const std::string& what);

/// Block `block` of `what` (of `key`), stored at `offset` of object `name`, is corrupt:
/// "<problem> in <what> (block <block>, <detail>)".
CAIRN_INLINE error corrupt_block(storage_ref st,
                                 const std::string& name,
                                 const std::string& key,
                                 const std::string& what,
                                 const std::string& problem,
                                 const std::string& detail,
                                 std::uint64_t block,
                                 std::uint64_t offset);

/// The compressed case of `read_verified_blocks`: reads each block's stored bytes (adjacent
/// blocks in one read), decompresses into `out` and verifies the data's checksum.
CAIRN_INLINE result<void> read_compressed_blocks(storage_ref st,
                                                 const checkpoint_metadata& m,
                                                 const extent& e,
                                                 std::uint64_t first_block,
                                                 std::uint64_t last_block,
                                                 std::span<std::byte> out,
                                                 const std::string& key,
                                                 const std::string& what);

}  // namespace detail

/// Reads blocks [first_block, last_block] of an extent into `out` (which must hold exactly
/// those bytes) and verifies each block's checksum. `what` names the item in errors
/// ("chunk 2 of tensor"), `key` its key.
CAIRN_INLINE result<void> read_verified_blocks(storage_ref st,
                                               const checkpoint_metadata& m,
                                               const extent& e,
                                               std::uint64_t first_block,
                                               std::uint64_t last_block,
                                               std::span<std::byte> out,
                                               const std::string& key,
                                               const std::string& what);

/// Checks that file `f` of `m` holds at least the bytes the metadata says it does, so that
/// memory sized by what the metadata claims is never allocated for a file that cannot fill it.
CAIRN_INLINE result<void> check_file_holds(storage_ref st,
                                           const checkpoint_metadata& m,
                                           std::uint32_t f);

/// What a reader needs of tensors whose chunks are in index files: per key, the boxes it will
/// read (empty: the whole tensor).
using index_wants = std::map<std::string, std::vector<box>>;

namespace detail {

/// Checks the checksum an index file's trailer holds against the manifest's record of the file.
CAIRN_INLINE result<void> trailer_matches(std::uint64_t sum,
                                          const file_record& f,
                                          const std::string& where);

/// Puts tensor `key`'s chunks, read from its index pages, into `m.tensors[key]`: chunks mapped
/// from writing ranks to data files, inside their files, tiles flattened.
CAIRN_INLINE result<void> take_index_chunks(storage_ref st,
                                            checkpoint_metadata& m,
                                            const std::string& key,
                                            std::vector<chunk_record> chunks,
                                            const std::vector<int>& data_file_of_rank);

/// Checks tensor `key`'s directory against the manifest's dtype, shape and chunk count.
CAIRN_INLINE result<void> check_directory(const checkpoint_metadata& m,
                                          const index_directory& d,
                                          const std::string& where);

/// Data file of each rank (-1: none), by rank.
CAIRN_INLINE std::vector<int> data_files_by_rank(const checkpoint_metadata& m);

/// Reads byte ranges of object `name` (sorted by offset), those stored back to back at once (up
/// to max_io_bytes), and hands each range's bytes to `take(i, bytes)`.
template <class Take>
result<void> read_ranges(storage_ref st,
                         const std::string& name,
                         const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                         const std::string& key,
                         const char* what,
                         Take&& take) {
  std::vector<std::byte> buf;
  for (std::size_t i = 0, j = 0; i < ranges.size(); i = j) {
    const std::uint64_t from = ranges[i].first;
    std::uint64_t to = from + ranges[i].second;
    for (j = i + 1;
         j < ranges.size() && ranges[j].first == to && to + ranges[j].second - from <= max_io_bytes;
         ++j)
      to += ranges[j].second;
    buf.resize(static_cast<std::size_t>(to - from));
    if (auto r = st.read(name, from, buf); !r)
      return read_failed(std::move(r).err(), st, name, key, what);
    for (std::size_t k = i; k < j; ++k)
      CAIRN_TRY(take(
          k, std::span<const std::byte>(buf).subspan(ranges[k].first - from, ranges[k].second)));
  }
  return ok();
}

/// Whether `b` meets one of `boxes` (none: the whole tensor is wanted, and everything meets it).
CAIRN_INLINE bool meets_any(const std::vector<box>& boxes, const box& b);

/// Reads the index of the tensors `want` names, all in index file `fi`, sorted by directory
/// offset: their directories, then the pages whose box meets the boxes `wants` gives them and
/// the entries of the grid cells that meet them (every page and cell when `wants` is null), and
/// puts the chunks of those pages that meet those boxes into `m.tensors`. `fetch(ranges, what,
/// take)` hands `take(i, bytes)` the bytes of each (offset, length) range of the file, sorted by
/// offset: read from storage, or cut from the whole file.
template <class Fetch>
result<void> read_file_index(storage_ref st,
                             checkpoint_metadata& m,
                             std::uint32_t fi,
                             const std::vector<std::pair<std::string, index_ref>>& want,
                             const index_wants* wants,
                             const std::vector<int>& data_file_of_rank,
                             Fetch&& fetch) {
  static const std::vector<box> whole;
  auto boxes_of = [&](const std::string& key) -> const std::vector<box>& {
    return wants ? wants->at(key) : whole;
  };
  const file_record& f = m.files.at(fi);
  const std::string where = st.describe(f.name);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [key, ref] : want) ranges.emplace_back(ref.offset, ref.length);
  std::vector<index_directory> dirs(want.size());
  CAIRN_TRY(fetch(
      ranges, "index directory", [&](std::size_t k, std::span<const std::byte> b) -> result<void> {
        const auto& [key, ref] = want[k];
        CAIRN_TRY_ASSIGN(dirs[k], read_index_directory(
                                      b, index_section{key, ref.offset, ref.length, ref.checksum},
                                      where, f.nbytes, index_version_of(m.version)));
        return check_directory(m, dirs[k], where);
      }));
  // What to read next: the pages whose box meets a wanted box, and the runs of grid cells that
  // meet one (their entries lie back to back).
  struct part_at {
    std::size_t dir;
    const index_page* page;  // or null: grid cells [first, first + count)
    std::uint64_t first = 0, count = 0;
    std::uint64_t offset = 0, length = 0;
  };
  std::vector<part_at> parts;
  for (std::size_t k = 0; k < dirs.size(); ++k) {
    const index_directory& d = dirs[k];
    if (const auto& g = d.grid) {
      const std::vector<std::uint64_t> cells = grid_cells_meeting(d, boxes_of(d.key));
      for (std::size_t i = 0, j = 0; i < cells.size(); i = j) {
        for (j = i + 1; j < cells.size() && cells[j] == cells[j - 1] + 1;) ++j;
        const std::uint64_t count = j - i;
        parts.push_back({k, nullptr, cells[i], count, g->offset + cells[i] * g->entry_bytes,
                         count * g->entry_bytes});
      }
      continue;
    }
    for (const index_page& p : d.pages)
      if (meets_any(boxes_of(d.key), p.bounds)) parts.push_back({k, &p, 0, 0, p.offset, p.length});
  }
  std::sort(parts.begin(), parts.end(),
            [](const part_at& a, const part_at& b) { return a.offset < b.offset; });
  ranges.clear();
  for (const auto& p : parts) ranges.emplace_back(p.offset, p.length);
  std::vector<std::vector<chunk_record>> chunks(dirs.size());
  CAIRN_TRY(
      fetch(ranges, "index page", [&](std::size_t k, std::span<const std::byte> b) -> result<void> {
        const part_at& p = parts[k];
        const index_directory& d = dirs[p.dir];
        CAIRN_TRY_ASSIGN(
            auto got,
            p.page ? read_index_page(b, d, *p.page, where, m.block_size, data_file_of_rank.size())
                   : read_grid_entries(b, d, p.first, p.count, where, m.block_size,
                                       data_file_of_rank.size()));
        // Only the chunks that meet a wanted box go on (to be checked and have
        // their tiles flattened): a page also holds other ranks' neighbours.
        auto& to = chunks[p.dir];
        for (auto& c : got)
          if (meets_any(boxes_of(d.key), c.region)) to.push_back(std::move(c));
        return ok();
      }));
  for (std::size_t k = 0; k < dirs.size(); ++k)
    CAIRN_TRY(take_index_chunks(st, m, dirs[k].key, std::move(chunks[k]), data_file_of_rank));
  return ok();
}

}  // namespace detail

/// Format version 4: reads, for each tensor `wants` names whose chunks are not known yet, its
/// directory and the pages holding chunks that meet the boxes it wants, and puts the chunks of
/// those pages that meet a wanted box into `m.tensors` (a load then checks that they cover its
/// boxes exactly, as it does for any index). Directories and pages that lie back to back are read
/// at once; each is checked against its checksum (a directory's is in the manifest, a page's in
/// its directory), and the header and trailer of every index file touched against the
/// manifest's record of it, before anything in it is used. Errors are errc::corrupt naming the
/// index file.
CAIRN_INLINE result<void> read_index_sections(storage_ref st,
                                              checkpoint_metadata& m,
                                              const index_wants& wants);

/// Format version 4: reads every index file whole (checked from magic to trailer, as `cairn
/// verify` does) and puts every tensor's chunks into `m.tensors`.
CAIRN_INLINE result<void> read_all_index_sections(storage_ref st, checkpoint_metadata& m);

/// Decodes a committed `metadata.json` and, for format version 4, reads every index section:
/// the whole checkpoint's metadata.
CAIRN_INLINE result<checkpoint_metadata> native_metadata(storage_ref st, std::string_view json);

/// Reads and decodes the committed metadata (see `read_metadata_json`), index sections and all.
CAIRN_INLINE result<checkpoint_metadata> read_metadata(storage_ref st);

/// Reads and decodes `metadata.json` alone: for format version 4, tensors' chunks stay in
/// their index files (`m.index_refs`; see `read_index_sections`).
CAIRN_INLINE result<checkpoint_metadata> read_manifest(storage_ref st);

/// Reads a whole extent and verifies it. The buffer grows as verified blocks arrive (up to
/// `max_io_bytes` at a time), so memory follows what the file really holds, never only what the
/// metadata claims: a truncated file or a block that does not decompress ends the read early.
CAIRN_INLINE result<std::vector<std::byte>> read_extent(storage_ref st,
                                                        const checkpoint_metadata& m,
                                                        const extent& e,
                                                        const std::string& key,
                                                        const std::string& what);

/// One problem `verify_checkpoint` found.
struct verify_problem {
  std::string item;  ///< "tensor 'w' chunk 3", "object 'rng/shard_0_2'", "common state"
  error err;
};

/// The common values of a checkpoint, by path: a foreign format's inline values, and the native
/// common-state file, read and verified.
CAIRN_INLINE result<std::map<std::string, common_value>> read_commons(storage_ref st,
                                                                      const checkpoint_metadata& m);

namespace detail {
/// The tensors of `m` whose chunks do not tile them exactly (checksums cannot tell a shifted or
/// duplicated chunk from a good one); `metadata_file` is named in the errors.
CAIRN_INLINE std::vector<verify_problem> tiling_problems(storage_ref st,
                                                         const checkpoint_metadata& m,
                                                         std::string_view metadata_file);

CAIRN_INLINE result<std::vector<verify_problem>> verify_checkpoint_impl(
    storage_ref st, int threads, const progress_callback& progress = {});
}  // namespace detail

/// Recomputes every checksum of every chunk, object and the common state, and checks every
/// data file's size. Returns all problems found (empty when the checkpoint is intact); fails
/// only when the metadata itself cannot be read. `progress` is told the bytes checked ("verify").
CAIRN_INLINE result<std::vector<verify_problem>> verify_checkpoint(
    storage_ref st, int threads = 2, const progress_callback& progress = {});

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/reader-inl.hpp"
#endif
