// cairn/format/native/reader.hpp: reading the native format: committed metadata, verified byte
// ranges, and whole-checkpoint verification.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cairn/core/checksum.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/parallel.hpp"
#include "cairn/format/native/index_file.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/plan/cover.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Largest single read or write cairn issues (bytes).
inline constexpr std::uint64_t max_io_bytes = std::uint64_t{64} << 20;

/// Reads the committed `metadata.json` as it is. A directory without it fails with
/// errc::incomplete_checkpoint ("incomplete checkpoint: ... has no metadata.json").
inline result<std::string> read_metadata_json(storage_ref st) {
  auto exists = st.exists(metadata_name);
  if (!exists) return std::move(exists).err();
  if (!*exists)
    return make_error(errc::incomplete_checkpoint,
                      "incomplete checkpoint: no " + std::string(metadata_name) +
                          " (the save never committed, or this is not a cairn "
                          "checkpoint)")
        .with_file(st.describe(metadata_name));
  CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(metadata_name));
  std::string json(n, '\0');
  CAIRN_TRY(st.read(metadata_name, 0, std::as_writable_bytes(std::span(json))));
  return json;
}

namespace detail {

/// A failed read of object `name` while reading `what` of `key`.
inline error read_failed(error err,
                         storage_ref st,
                         const std::string& name,
                         const std::string& key,
                         const std::string& what) {
  err.message = what + ": " + err.message;
  return std::move(err).with_key(key).with_file(st.describe(name));
}

/// Block `block` of `what` (of `key`), stored at `offset` of object `name`, is corrupt:
/// "<problem> in <what> (block <block>, <detail>)".
inline error corrupt_block(storage_ref st,
                           const std::string& name,
                           const std::string& key,
                           const std::string& what,
                           const std::string& problem,
                           const std::string& detail,
                           std::uint64_t block,
                           std::uint64_t offset) {
  error err = make_error(errc::corrupt, problem + " in " + what + " (block " +
                                            std::to_string(block) + ", " + detail + ")");
  err.key = key;
  err.file = st.describe(name);
  err.offset = offset;
  return err;
}

/// The compressed case of `read_verified_blocks`: reads each block's stored bytes (adjacent
/// blocks in one read), decompresses into `out` and verifies the data's checksum.
inline result<void> read_compressed_blocks(storage_ref st,
                                           const checkpoint_metadata& m,
                                           const extent& e,
                                           std::uint64_t first_block,
                                           std::uint64_t last_block,
                                           std::span<std::byte> out,
                                           const std::string& key,
                                           const std::string& what) {
  const std::string& name = m.files.at(e.file).name;
  const std::uint64_t B = m.block_size;
  std::vector<std::byte> stored;
  for (std::uint64_t b = first_block; b <= last_block;) {
    // A run of blocks stored back to back, read at once (up to max_io_bytes).
    std::uint64_t end = b + 1, bytes = e.block_stored.at(b);
    while (end <= last_block &&
           e.block_offsets.at(end) == e.block_offsets[end - 1] + e.block_stored[end - 1] &&
           bytes + e.block_stored[end] <= max_io_bytes)
      bytes += e.block_stored[end++];
    stored.resize(bytes);
    if (auto r = st.read(name, e.block_offsets[b], stored); !r)
      return read_failed(std::move(r).err(), st, name, key, what);
    for (const std::byte* src = stored.data(); b < end; src += e.block_stored[b++]) {
      std::uint64_t len = std::min(B, e.nbytes - b * B);
      std::span<std::byte> dst = out.subspan((b - first_block) * B, len);
      std::uint64_t n = e.block_stored[b];
      if (n == len) {
        std::memcpy(dst.data(), src, len);
      } else {
        std::size_t got = ZSTD_decompress(dst.data(), dst.size(), src, n);
        if (ZSTD_isError(got) || got != len)
          return corrupt_block(
              st, name, key, what, "zstd block does not decompress",
              "expected " + std::to_string(len) + " bytes" +
                  (ZSTD_isError(got) ? std::string(": ") + ZSTD_getErrorName(got) : ""),
              b, e.block_offsets[b]);
      }
      if (checksum(dst) != e.checksums.at(b))
        return corrupt_block(st, name, key, what, "checksum mismatch after decompressing",
                             std::to_string(len) + " bytes", b, e.block_offsets[b]);
    }
  }
  return ok();
}

}  // namespace detail

/// Reads blocks [first_block, last_block] of an extent into `out` (which must hold exactly
/// those bytes) and verifies each block's checksum. `what` names the item in errors
/// ("chunk 2 of tensor"), `key` its key.
inline result<void> read_verified_blocks(storage_ref st,
                                         const checkpoint_metadata& m,
                                         const extent& e,
                                         std::uint64_t first_block,
                                         std::uint64_t last_block,
                                         std::span<std::byte> out,
                                         const std::string& key,
                                         const std::string& what) {
  if (e.compressed())
    return detail::read_compressed_blocks(st, m, e, first_block, last_block, out, key, what);
  const std::string& name = m.files.at(e.file).name;
  const std::uint64_t B = m.block_size;
  const std::uint64_t start = first_block * B;
  if (auto r = st.read(name, e.byte_offset + start, out); !r)
    return detail::read_failed(std::move(r).err(), st, name, key, what);
  if (!m.verified()) return ok();  // a foreign format: nothing to verify against
  for (std::uint64_t b = first_block; b <= last_block; ++b) {
    std::uint64_t len = std::min(B, e.nbytes - b * B);
    if (checksum(out.subspan(b * B - start, len)) != e.checksums.at(b))
      return detail::corrupt_block(st, name, key, what, "checksum mismatch",
                                   std::to_string(len) + " bytes", b, e.byte_offset + b * B);
  }
  return ok();
}

/// Checks that file `f` of `m` holds at least the bytes the metadata says it does, so that
/// memory sized by what the metadata claims is never allocated for a file that cannot fill it.
inline result<void> check_file_holds(storage_ref st,
                                     const checkpoint_metadata& m,
                                     std::uint32_t f) {
  if (f >= m.files.size())
    return make_error(errc::corrupt,
                      "malformed metadata: file index " + std::to_string(f) + " is out of range");
  const file_record& r = m.files[f];
  auto n = st.size(r.name);
  if (!n) return std::move(n).err().with_file(st.describe(r.name));
  if (*n < r.nbytes)
    return make_error(errc::corrupt, "the file holds " + std::to_string(*n) +
                                         " bytes, the metadata says " + std::to_string(r.nbytes) +
                                         ": it is truncated")
        .with_file(st.describe(r.name));
  return ok();
}

/// What a reader needs of tensors whose chunks are in index files: per key, the boxes it will
/// read (empty: the whole tensor).
using index_wants = std::map<std::string, std::vector<box>>;

namespace detail {

/// Checks the checksum an index file's trailer holds against the manifest's record of the file.
inline result<void> trailer_matches(std::uint64_t sum,
                                    const file_record& f,
                                    const std::string& where) {
  if (sum == f.checksum) return ok();
  return index_error(where, f.nbytes - index_trailer_bytes, {},
                     "index checksum mismatch: the file's trailer and the manifest disagree (one "
                     "was changed or damaged after it was written)");
}

/// Puts tensor `key`'s chunks, read from its index pages, into `m.tensors[key]`: chunks mapped
/// from writing ranks to data files, inside their files, tiles flattened.
inline result<void> take_index_chunks(storage_ref st,
                                      checkpoint_metadata& m,
                                      const std::string& key,
                                      std::vector<chunk_record> chunks,
                                      const std::vector<int>& data_file_of_rank) {
  const index_ref ref = m.index_refs.at(key);
  const std::string where = st.describe(m.files.at(ref.file).name);
  tensor_record t{m.tensors.at(key).type, m.tensors.at(key).global_shape, std::move(chunks)};
  for (chunk_record& c : t.chunks) {
    const int f = data_file_of_rank.at(c.where.file);
    if (f < 0)
      return index_error(where, ref.offset, key,
                         "malformed index: a chunk was written by rank " +
                             std::to_string(c.where.file) + ", which has no data file");
    c.where.file = static_cast<std::uint32_t>(f);
  }
  CAIRN_TRY(check_tensor_chunks(m, key, t, where));
  CAIRN_TRY(flatten_tensor_tiles(m, key, t, where));
  m.tensors.at(key).chunks = std::move(t.chunks);
  m.index_refs.erase(key);
  return ok();
}

/// Checks tensor `key`'s directory against the manifest's dtype, shape and chunk count.
inline result<void> check_directory(const checkpoint_metadata& m,
                                    const index_directory& d,
                                    const std::string& where) {
  const index_ref& ref = m.index_refs.at(d.key);
  const tensor_record& t = m.tensors.at(d.key);
  std::string problem;
  if (d.type != t.type || d.global_shape != t.global_shape)
    problem = "the directory's dtype or shape differs from the manifest's";
  else if (d.chunks != ref.chunks)
    problem = "the directory holds " + std::to_string(d.chunks) + " chunks, the manifest says " +
              std::to_string(ref.chunks);
  if (problem.empty()) return ok();
  return index_error(where, ref.offset, d.key, "malformed index: " + problem);
}

/// Data file of each rank (-1: none), by rank.
inline std::vector<int> data_files_by_rank(const checkpoint_metadata& m) {
  std::vector<int> of(static_cast<std::size_t>(std::max(m.world_size, 0)), -1);
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].role == file_role::data && m.files[i].rank >= 0 &&
        static_cast<std::size_t>(m.files[i].rank) < of.size())
      of[static_cast<std::size_t>(m.files[i].rank)] = static_cast<int>(i);
  return of;
}

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
inline bool meets_any(const std::vector<box>& boxes, const box& b) {
  return boxes.empty() || std::any_of(boxes.begin(), boxes.end(), [&](const box& w) {
           return w.size.size() == b.size.size() && intersect(w, b).has_value();
         });
}

/// Reads the index of the tensors `want` names, all in index file `fi`, sorted by directory
/// offset: their directories, then the pages whose box meets the boxes `wants` gives them (every
/// page when `wants` is null), and puts the chunks of those pages that meet those boxes into
/// `m.tensors`. `fetch(ranges, what, take)` hands `take(i, bytes)` the bytes of each (offset,
/// length) range of the file, sorted by offset: read from storage, or cut from the whole file.
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
                                      where, f.nbytes));
        return check_directory(m, dirs[k], where);
      }));
  struct page_at {
    std::size_t dir;
    const index_page* page;
  };
  std::vector<page_at> pages;
  for (std::size_t k = 0; k < dirs.size(); ++k)
    for (const index_page& p : dirs[k].pages)
      if (meets_any(boxes_of(dirs[k].key), p.bounds)) pages.push_back({k, &p});
  std::sort(pages.begin(), pages.end(),
            [](const page_at& a, const page_at& b) { return a.page->offset < b.page->offset; });
  ranges.clear();
  for (const auto& p : pages) ranges.emplace_back(p.page->offset, p.page->length);
  std::vector<std::vector<chunk_record>> chunks(dirs.size());
  CAIRN_TRY(
      fetch(ranges, "index page", [&](std::size_t k, std::span<const std::byte> b) -> result<void> {
        const index_directory& d = dirs[pages[k].dir];
        CAIRN_TRY_ASSIGN(auto got, read_index_page(b, d, *pages[k].page, where, m.block_size,
                                                   data_file_of_rank.size()));
        // Only the chunks that meet a wanted box go on (to be checked and have
        // their tiles flattened): a page also holds other ranks' neighbours.
        auto& to = chunks[pages[k].dir];
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
inline result<void> read_index_sections(storage_ref st,
                                        checkpoint_metadata& m,
                                        const index_wants& wants) {
  std::vector<std::pair<std::string, index_ref>> want;
  for (const auto& [k, boxes] : wants)
    if (auto it = m.index_refs.find(k); it != m.index_refs.end()) want.emplace_back(k, it->second);
  std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second.file, a.second.offset) < std::pair(b.second.file, b.second.offset);
  });
  const std::vector<int> data_file_of_rank = detail::data_files_by_rank(m);
  for (std::size_t i = 0, j = 0; i < want.size(); i = j) {
    const std::uint32_t fi = want[i].second.file;
    for (j = i; j < want.size() && want[j].second.file == fi;) ++j;
    const file_record& f = m.files.at(fi);
    const std::string where = st.describe(f.name);
    std::array<std::byte, index_header_bytes> head;
    std::array<std::byte, index_trailer_bytes> tail;
    for (auto [at, into] : {std::pair{std::uint64_t{0}, std::span<std::byte>(head)},
                            std::pair{f.nbytes - index_trailer_bytes, std::span<std::byte>(tail)}})
      if (auto r = st.read(f.name, at, into); !r)
        return detail::read_failed(std::move(r).err(), st, f.name, want[i].first, "index file");
    CAIRN_TRY_ASSIGN(std::uint64_t sum, check_index_ends(head, tail, f.nbytes, where));
    CAIRN_TRY(detail::trailer_matches(sum, f, where));
    const std::vector<std::pair<std::string, index_ref>> in_file(want.begin() + i,
                                                                 want.begin() + j);
    CAIRN_TRY(detail::read_file_index(st, m, fi, in_file, &wants, data_file_of_rank,
                                      [&](const auto& ranges, const char* what, auto&& take) {
                                        return detail::read_ranges(
                                            st, f.name, ranges, in_file.front().first, what, take);
                                      }));
  }
  return ok();
}

/// Format version 4: reads every index file whole (checked from magic to trailer, as `cairn
/// verify` does) and puts every tensor's chunks into `m.tensors`.
inline result<void> read_all_index_sections(storage_ref st, checkpoint_metadata& m) {
  if (m.index_refs.empty()) return ok();
  const std::vector<int> data_file_of_rank = detail::data_files_by_rank(m);
  for (std::uint32_t fi = 0; fi < m.files.size(); ++fi) {
    const file_record& f = m.files[fi];
    if (f.role != file_role::index) continue;
    CAIRN_TRY(check_file_holds(st, m, fi));
    std::vector<std::byte> whole(static_cast<std::size_t>(f.nbytes));
    if (auto r = st.read(f.name, 0, whole); !r)
      return detail::read_failed(std::move(r).err(), st, f.name, "", "index file");
    const std::string where = st.describe(f.name);
    CAIRN_TRY_ASSIGN(std::uint64_t sum, check_index_file(whole, where));
    CAIRN_TRY(detail::trailer_matches(sum, f, where));
    std::vector<std::pair<std::string, index_ref>> in_file;
    for (const auto& [k, ref] : m.index_refs)
      if (ref.file == fi) in_file.emplace_back(k, ref);
    std::sort(in_file.begin(), in_file.end(),
              [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
    CAIRN_TRY(detail::read_file_index(
        st, m, fi, in_file, nullptr, data_file_of_rank,
        [&](const auto& ranges, const char*, auto&& take) -> result<void> {
          for (std::size_t k = 0; k < ranges.size(); ++k)
            CAIRN_TRY(take(
                k, std::span<const std::byte>(whole).subspan(ranges[k].first, ranges[k].second)));
          return ok();
        }));
  }
  return ok();
}

/// Decodes a committed `metadata.json` and, for format version 4, reads every index section:
/// the whole checkpoint's metadata.
inline result<checkpoint_metadata> native_metadata(storage_ref st, std::string_view json) {
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, metadata_from_json(json, st.describe(metadata_name)));
  CAIRN_TRY(read_all_index_sections(st, m));
  return m;
}

/// Reads and decodes the committed metadata (see `read_metadata_json`), index sections and all.
inline result<checkpoint_metadata> read_metadata(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return native_metadata(st, json);
  });
}

/// Reads and decodes `metadata.json` alone: for format version 4, tensors' chunks stay in
/// their index files (`m.index_refs`; see `read_index_sections`).
inline result<checkpoint_metadata> read_manifest(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return metadata_from_json(json, st.describe(metadata_name));
  });
}

/// The user's content metadata of a checkpoint, read without touching any data file.
inline result<std::map<std::string, std::string>> read_content_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(auto m, read_manifest(st));
  return std::move(m.content_metadata);
}

/// Reads a whole extent and verifies it. The buffer grows as verified blocks arrive (up to
/// `max_io_bytes` at a time), so memory follows what the file really holds, never only what the
/// metadata claims: a truncated file or a block that does not decompress ends the read early.
inline result<std::vector<std::byte>> read_extent(storage_ref st,
                                                  const checkpoint_metadata& m,
                                                  const extent& e,
                                                  const std::string& key,
                                                  const std::string& what) {
  std::vector<std::byte> buf;
  if (e.nbytes == 0) return buf;
  const std::uint64_t B = m.block_size;
  const std::uint64_t blocks = e.nbytes / B + (e.nbytes % B != 0);
  const std::uint64_t per_read = std::max<std::uint64_t>(1, max_io_bytes / B);
  for (std::uint64_t b = 0; b < blocks; b += per_read) {
    const std::uint64_t last = std::min(blocks, b + per_read) - 1;
    const std::uint64_t end = std::min(e.nbytes, (last + 1) * B);
    buf.resize(static_cast<std::size_t>(end));
    std::span<std::byte> part(buf.data() + b * B, static_cast<std::size_t>(end - b * B));
    CAIRN_TRY(read_verified_blocks(st, m, e, b, last, part, key, what));
  }
  return buf;
}

/// One problem `verify_checkpoint` found.
struct verify_problem {
  std::string item;  ///< "tensor 'w' chunk 3", "object 'rng/shard_0_2'", "common state"
  error err;
};

/// The common values of a checkpoint, by path: a foreign format's inline values, and the native
/// common-state file, read and verified.
inline result<std::map<std::string, common_value>> read_commons(storage_ref st,
                                                                const checkpoint_metadata& m) {
  std::map<std::string, common_value> out = m.inline_commons;
  if (!m.common) return out;
  CAIRN_TRY_ASSIGN(auto buf, read_extent(st, m, *m.common, "", "common state"));
  for (const auto& [path, rec] : m.commons) {
    if (rec.offset + rec.nbytes > buf.size())
      return make_error(errc::corrupt, "common value lies outside the common state").with_key(path);
    common_value v;
    v.kind = rec.kind;
    v.type = rec.type;
    v.data.assign(buf.begin() + static_cast<std::ptrdiff_t>(rec.offset),
                  buf.begin() + static_cast<std::ptrdiff_t>(rec.offset + rec.nbytes));
    out.emplace(path, std::move(v));
  }
  return out;
}

namespace detail {
/// The tensors of `m` whose chunks do not tile them exactly (checksums cannot tell a shifted or
/// duplicated chunk from a good one); `metadata_file` is named in the errors.
inline std::vector<verify_problem> tiling_problems(storage_ref st,
                                                   const checkpoint_metadata& m,
                                                   std::string_view metadata_file) {
  std::vector<verify_problem> problems;
  for (const auto& [k, t] : m.tensors) {
    std::vector<box> regions;
    regions.reserve(t.chunks.size());
    for (const auto& c : t.chunks) regions.push_back(c.region);
    const box whole{shape(t.global_shape.size(), 0), t.global_shape};
    if (auto p = check_exact_cover(regions, whole)) {
      std::string msg = p->what == cover_problem::kind::overlap
                            ? "chunks " + regions[p->first].str() + " and " +
                                  regions[p->second].str() + " overlap at " + p->shared.str()
                            : "chunks cover " + std::to_string(p->covered) + " of " +
                                  std::to_string(p->wanted) + " elements" +
                                  (p->missing ? "; none holds " + p->missing->str() : "");
      error e = make_error(errc::integrity, std::move(msg));
      e.key = k;
      e.file = st.describe(metadata_file);
      problems.push_back({"tensor '" + k + "'", std::move(e)});
    }
  }
  return problems;
}

inline result<std::vector<verify_problem>> verify_checkpoint_impl(
    storage_ref st, int threads, const progress_callback& progress = {}) {
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_metadata(st));
  struct item {
    std::string label, key;
    const extent* e;
  };
  std::vector<item> items;
  for (const auto& [k, t] : m.tensors)
    for (std::size_t i = 0; i < t.chunks.size(); ++i)
      items.push_back({"tensor '" + k + "' chunk " + std::to_string(i), k, &t.chunks[i].where});
  for (const auto& [k, o] : m.objects) items.push_back({"object '" + k + "'", o.key, &o.where});
  if (m.common) items.push_back({"common state", "", &*m.common});
  std::vector<verify_problem> problems = tiling_problems(st, m, metadata_name);
  for (const auto& f : m.files) {
    auto sz = st.size(f.name);
    if (!sz) {
      problems.push_back({"file " + f.name, std::move(sz).err()});
    } else if (*sz != f.nbytes) {
      error e = make_error(errc::corrupt, "file has " + std::to_string(*sz) +
                                              " bytes, metadata says " + std::to_string(f.nbytes));
      e.file = st.describe(f.name);
      problems.push_back({"file " + f.name, std::move(e)});
    }
  }
  std::vector<std::optional<error>> found(items.size());
  std::uint64_t total = 0;
  for (const auto& it : items) total += it.e->nbytes;
  progress_meter meter(&progress, "verify", total);
  // Per item, read in bounded pieces so memory stays small.
  auto r = [&]() -> result<void> {
    std::uint64_t blocks_per_io = std::max<std::uint64_t>(1, max_io_bytes / m.block_size);
    return detail::run_parallel(items.size(), threads, [&](std::size_t i) -> result<void> {
      const extent& e = *items[i].e;
      std::vector<std::byte> buf;
      for (std::uint64_t b = 0; b < e.checksums.size(); b += blocks_per_io) {
        std::uint64_t last = std::min<std::uint64_t>(e.checksums.size(), b + blocks_per_io) - 1;
        std::uint64_t len = std::min(e.nbytes, (last + 1) * m.block_size) - b * m.block_size;
        buf.resize(len);
        auto v = read_verified_blocks(st, m, e, b, last, buf, items[i].key, items[i].label);
        if (!v) {
          found[i] = std::move(v).err();
          break;
        }
        meter.add(len);
      }
      return ok();
    });
  }();
  if (!r) return std::move(r).err();
  meter.finish();  // items that failed part way count as checked
  for (std::size_t i = 0; i < items.size(); ++i)
    if (found[i]) problems.push_back({items[i].label, std::move(*found[i])});
  return problems;
}
}  // namespace detail

/// Recomputes every checksum of every chunk, object and the common state, and checks every
/// data file's size. Returns all problems found (empty when the checkpoint is intact); fails
/// only when the metadata itself cannot be read. `progress` is told the bytes checked ("verify").
inline result<std::vector<verify_problem>> verify_checkpoint(
    storage_ref st, int threads = 2, const progress_callback& progress = {}) {
  return detail::catch_all("verifying the checkpoint",
                           [&] { return detail::verify_checkpoint_impl(st, threads, progress); });
}

}  // namespace cairn
