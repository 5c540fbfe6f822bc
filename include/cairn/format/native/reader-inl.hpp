// cairn/format/native/reader-inl.hpp: the bodies of cairn/format/native/reader.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>

#include "cairn/detail/parallel.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/plan/cover.hpp"

namespace cairn {

CAIRN_INLINE result<std::string> read_metadata_json(storage_ref st) {
  auto exists = st.exists(metadata_name);
  if (!exists) return std::move(exists).err();
  if (!*exists) return detail::no_checkpoint_error(st);
  CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(metadata_name));
  std::string json(n, '\0');
  CAIRN_TRY(st.read(metadata_name, 0, std::as_writable_bytes(std::span(json))));
  return json;
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE error no_checkpoint_error(storage_ref st, bool (*commits)(std::string_view)) {
  auto names = st.list("");
  if (names && names->empty())
    return make_error(errc::not_found,
                      "no checkpoint here: the location does not exist or is empty (a mistyped "
                      "path?)")
        .with_file(st.describe(""));
  if (names) {
    // A folder of checkpoints, each in its own folder with its metadata: a checkpointer's root.
    std::vector<std::string> inside;
    for (const auto& n : *names) {
      std::size_t slash = n.find('/');
      if (slash == std::string::npos || n.find('/', slash + 1) != std::string::npos) continue;
      std::string_view file = std::string_view(n).substr(slash + 1);
      if (commits ? commits(file) : file == metadata_name) inside.push_back(n.substr(0, slash));
    }
    if (!inside.empty()) {
      std::string latest;
      if (auto size = st.size("latest"); size && *size > 0 && *size < 4096) {
        latest.resize(static_cast<std::size_t>(*size));
        if (!st.read("latest", 0, std::as_writable_bytes(std::span(latest)))) latest.clear();
        while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' '))
          latest.pop_back();
      }
      std::string which =
          !latest.empty()
              ? "its `latest` names " + latest + ": load " + st.describe(latest)
              : "it holds " + inside.back() +
                    (inside.size() > 1 ? " and " + std::to_string(inside.size() - 1) + " more"
                                       : std::string()) +
                    ": load one of them";
      return make_error(errc::not_found,
                        "this is a folder of checkpoints (a checkpointer's root), not a "
                        "checkpoint; " +
                            which +
                            ", or resume with checkpointer::load_latest (`cairn ls` lists them)")
          .with_file(st.describe(""));
    }
  }
  return make_error(errc::incomplete_checkpoint,
                    "no " + std::string(metadata_name) +
                        ": the save never committed, or this is not a cairn checkpoint")
      .with_file(st.describe(metadata_name));
}

CAIRN_INLINE error read_failed(error err,
                               storage_ref st,
                               const std::string& name,
                               const std::string& key,
                               const std::string& what) {
  err.message = what + ": " + err.message;
  return std::move(err).with_key(key).with_file(st.describe(name));
}

CAIRN_INLINE error corrupt_block(storage_ref st,
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

CAIRN_INLINE result<void> read_compressed_blocks(storage_ref st,
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

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> read_verified_blocks(storage_ref st,
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

CAIRN_INLINE result<void> check_file_holds(storage_ref st,
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

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<void> trailer_matches(std::uint64_t sum,
                                          const file_record& f,
                                          const std::string& where) {
  if (sum == f.checksum) return ok();
  return index_error(where, f.nbytes - index_trailer_bytes, {},
                     "index checksum mismatch: the file's trailer and the manifest disagree (one "
                     "was changed or damaged after it was written)");
}

CAIRN_INLINE result<void> take_index_chunks(storage_ref st,
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

CAIRN_INLINE result<void> check_directory(const checkpoint_metadata& m,
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

CAIRN_INLINE std::vector<int> data_files_by_rank(const checkpoint_metadata& m) {
  std::vector<int> of(static_cast<std::size_t>(std::max(m.world_size, 0)), -1);
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (m.files[i].role == file_role::data && m.files[i].rank >= 0 &&
        static_cast<std::size_t>(m.files[i].rank) < of.size())
      of[static_cast<std::size_t>(m.files[i].rank)] = static_cast<int>(i);
  return of;
}

CAIRN_INLINE bool meets_any(const std::vector<box>& boxes, const box& b) {
  return boxes.empty() || std::any_of(boxes.begin(), boxes.end(), [&](const box& w) {
           return w.size.size() == b.size.size() && intersect(w, b).has_value();
         });
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> read_index_sections(storage_ref st,
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
    CAIRN_TRY_ASSIGN(std::uint64_t sum,
                     check_index_ends(head, tail, f.nbytes, where, index_version_of(m.version)));
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

CAIRN_INLINE result<void> read_all_index_sections(storage_ref st, checkpoint_metadata& m) {
  if (m.index_refs.empty()) return ok();
  const std::vector<int> data_file_of_rank = detail::data_files_by_rank(m);
  // Each index file's sections in file order, from one pass over the references.
  std::map<std::uint32_t, std::vector<std::pair<std::string, index_ref>>> by_file;
  for (const auto& [k, ref] : m.index_refs) by_file[ref.file].emplace_back(k, ref);
  std::vector<std::uint32_t> files;
  for (std::uint32_t fi = 0; fi < m.files.size(); ++fi)
    if (m.files[fi].role == file_role::index) files.push_back(fi);
  // Files are read and checked `at_once` at a time on as many threads (storage latency, not
  // bandwidth, bounds a checkpoint of many small index files), then parsed in file order.
  constexpr std::size_t at_once = 8;
  for (std::size_t first = 0; first < files.size(); first += at_once) {
    const std::size_t n = std::min(at_once, files.size() - first);
    std::vector<std::vector<std::byte>> whole(n);
    CAIRN_TRY(detail::run_parallel(n, static_cast<int>(n), [&](std::size_t i) -> result<void> {
      const std::uint32_t fi = files[first + i];
      const file_record& f = m.files[fi];
      CAIRN_TRY(check_file_holds(st, m, fi));
      whole[i].resize(static_cast<std::size_t>(f.nbytes));
      if (auto r = st.read(f.name, 0, whole[i]); !r)
        return detail::read_failed(std::move(r).err(), st, f.name, "", "index file");
      const std::string where = st.describe(f.name);
      CAIRN_TRY_ASSIGN(std::uint64_t sum,
                       check_index_file(whole[i], where, index_version_of(m.version)));
      return detail::trailer_matches(sum, f, where);
    }));
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t fi = files[first + i];
      std::vector<std::pair<std::string, index_ref>>& in_file = by_file[fi];
      std::sort(in_file.begin(), in_file.end(),
                [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
      const std::vector<std::byte>& bytes_of_file = whole[i];
      CAIRN_TRY(detail::read_file_index(
          st, m, fi, in_file, nullptr, data_file_of_rank,
          [&](const auto& ranges, const char*, auto&& take) -> result<void> {
            for (std::size_t k = 0; k < ranges.size(); ++k)
              CAIRN_TRY(take(k, std::span<const std::byte>(bytes_of_file)
                                    .subspan(ranges[k].first, ranges[k].second)));
            return ok();
          }));
      whole[i] = {};
    }
  }
  return ok();
}

CAIRN_INLINE result<checkpoint_metadata> native_metadata(storage_ref st, std::string_view json) {
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, metadata_from_json(json, st.describe(metadata_name)));
  CAIRN_TRY(read_all_index_sections(st, m));
  return m;
}

CAIRN_INLINE result<checkpoint_metadata> read_metadata(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return native_metadata(st, json);
  });
}

CAIRN_INLINE result<checkpoint_metadata> read_manifest(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return metadata_from_json(json, st.describe(metadata_name));
  });
}

CAIRN_INLINE result<std::vector<std::byte>> read_extent(storage_ref st,
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

CAIRN_INLINE result<std::map<std::string, common_value>> read_commons(
    storage_ref st, const checkpoint_metadata& m) {
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

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE std::vector<verify_problem> tiling_problems(storage_ref st,
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

CAIRN_INLINE result<std::vector<verify_problem>> verify_checkpoint_impl(
    storage_ref st, int threads, const progress_callback& progress) {
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

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<std::vector<verify_problem>> verify_checkpoint(
    storage_ref st, int threads, const progress_callback& progress) {
  return detail::catch_all("verifying the checkpoint",
                           [&] { return detail::verify_checkpoint_impl(st, threads, progress); });
}

}  // namespace cairn
