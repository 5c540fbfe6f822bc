// cairn/format/native/reader.hpp: reading the native format: committed metadata, verified byte
// ranges, and whole-checkpoint verification.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cairn/core/checksum.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/parallel.hpp"
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

/// Reads and decodes the committed metadata (see `read_metadata_json`).
inline result<checkpoint_metadata> read_metadata(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return metadata_from_json(json, st.describe(metadata_name));
  });
}

/// The user's content metadata of a checkpoint, read without touching any data file.
inline result<std::map<std::string, std::string>> read_content_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(auto m, read_metadata(st));
  return std::move(m.content_metadata);
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
inline result<std::vector<verify_problem>> verify_checkpoint_impl(storage_ref st, int threads) {
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
  std::vector<verify_problem> problems;
  // Every tensor's chunks must tile it exactly: checksums cannot tell a shifted or duplicated
  // chunk from a good one.
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
                                  std::to_string(p->wanted) + " elements";
      error e = make_error(errc::integrity, std::move(msg));
      e.key = k;
      e.file = st.describe(metadata_name);
      problems.push_back({"tensor '" + k + "'", std::move(e)});
    }
  }
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
      }
      return ok();
    });
  }();
  if (!r) return std::move(r).err();
  for (std::size_t i = 0; i < items.size(); ++i)
    if (found[i]) problems.push_back({items[i].label, std::move(*found[i])});
  return problems;
}
}  // namespace detail

/// Recomputes every checksum of every chunk, object and the common state, and checks every
/// data file's size. Returns all problems found (empty when the checkpoint is intact); fails
/// only when the metadata itself cannot be read.
inline result<std::vector<verify_problem>> verify_checkpoint(storage_ref st, int threads = 2) {
  return detail::catch_all("verifying the checkpoint",
                           [&] { return detail::verify_checkpoint_impl(st, threads); });
}

}  // namespace cairn
