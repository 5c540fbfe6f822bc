// cairn/format/native/index_file.hpp: the binary, checksummed index file of format version 4
// (in progress, issue 13): per tensor one section with every chunk's box, tiles, place and
// checksums, so that metadata.json can keep only tensor-level entries and a loading rank reads
// only the sections of the tensors it needs.
//
// Layout, little-endian:
//
//     "CAIRNIDX"  u32 version (4)  u32 0                      header, 16 bytes
//     section*                                                 back to back
//     u64 XXH3-64 of every byte before it   "CAIRNEND"         trailer, 16 bytes
//
//     section = u32 key_len, key bytes (UTF-8), u8 dtype (its position in `all_dtypes`: bool 0,
//               u8 1, ..., f8_e5m2 14), u8 ndim, i64 shape[ndim],
//               u64 chunk_count, chunk*
//     chunk   = i64 offset[ndim], i64 size[ndim], u8 tiled, [i64 tiles[ndim]],
//               u32 file, u64 byte_offset, u64 nbytes, u8 compressed,
//               u64 checksums[blocks], [u64 block_offsets[blocks], u64 block_stored[blocks]]
//
// `blocks` is the chunk's tile count when tiled, else ceil(nbytes / block_size). A section is
// found through its (offset, length, XXH3-64) in the manifest, so a reader checks the bytes it
// reads before it parses them; parsing still checks every count and box against what it has
// read, and every error names the file and the offset of the field it could not accept.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/checksum.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/index.hpp"

namespace cairn {

/// Magic bytes opening an index file.
inline constexpr std::string_view index_file_magic = "CAIRNIDX";
/// Magic bytes closing an index file, after its checksum.
inline constexpr std::string_view index_file_end = "CAIRNEND";
/// Header and trailer sizes of an index file.
inline constexpr std::size_t index_header_bytes = 16, index_trailer_bytes = 16;
/// The most axes a tensor in an index may have.
inline constexpr std::size_t index_max_axes = 64;

/// Where one tensor's section lies in an index file, and its checksum (what the manifest keeps).
struct index_section {
  std::string key;
  std::uint64_t offset = 0, length = 0;
  std::uint64_t checksum = 0;  ///< XXH3-64 of the section's bytes
};

namespace detail {

/// Appends `v`'s bytes (little-endian on every machine cairn builds for).
template <class T>
void put_num(bytes& b, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}
inline void put_u32(bytes& b, std::uint32_t v) { put_num(b, v); }
inline void put_u64(bytes& b, std::uint64_t v) { put_num(b, v); }
inline void put_ints(bytes& b, const shape& s) {
  for (std::int64_t v : s) put_u64(b, static_cast<std::uint64_t>(v));
}
inline void put_u64s(bytes& b, const std::vector<std::uint64_t>& v) {
  for (std::uint64_t x : v) put_u64(b, x);
}

/// The checksum blocks an extent of a chunk has: its tiles, or one per block_size bytes.
inline std::uint64_t chunk_blocks(const chunk_record& c, std::uint64_t block_size) {
  if (!c.tiles.empty()) return static_cast<std::uint64_t>(tile_count(c.region, c.tiles));
  return c.where.nbytes / block_size + (c.where.nbytes % block_size != 0);
}

}  // namespace detail

/// Appends tensor `key`'s section to `out`. The record must be consistent (as a save makes
/// it): every chunk has its checksums, and its block offsets when compressed.
inline void append_index_section(bytes& out, std::string_view key, const tensor_record& t) {
  detail::put_u32(out, static_cast<std::uint32_t>(key.size()));
  const auto* k = reinterpret_cast<const std::byte*>(key.data());
  out.insert(out.end(), k, k + key.size());
  out.push_back(static_cast<std::byte>(t.type));
  out.push_back(static_cast<std::byte>(t.global_shape.size()));
  detail::put_ints(out, t.global_shape);
  detail::put_u64(out, t.chunks.size());
  for (const chunk_record& c : t.chunks) {
    detail::put_ints(out, c.region.offset);
    detail::put_ints(out, c.region.size);
    out.push_back(std::byte{!c.tiles.empty()});
    detail::put_ints(out, c.tiles);
    detail::put_u32(out, c.where.file);
    detail::put_u64(out, c.where.byte_offset);
    detail::put_u64(out, c.where.nbytes);
    out.push_back(std::byte{c.where.compressed()});
    detail::put_u64s(out, c.where.checksums);
    detail::put_u64s(out, c.where.block_offsets);
    detail::put_u64s(out, c.where.block_stored);
  }
}

/// Builds an index file: `add` tensors (each becomes a section), then `finish`.
class index_file_builder {
 public:
  index_file_builder() {
    bytes_.insert(bytes_.end(), reinterpret_cast<const std::byte*>(index_file_magic.data()),
                  reinterpret_cast<const std::byte*>(index_file_magic.data()) + 8);
    detail::put_u32(bytes_, 4);
    detail::put_u32(bytes_, 0);
  }
  /// Adds tensor `key`'s section; returns where it lies.
  index_section add(std::string_view key, const tensor_record& t) {
    index_section s{std::string(key), bytes_.size(), 0, 0};
    append_index_section(bytes_, key, t);
    s.length = bytes_.size() - s.offset;
    s.checksum = checksum(std::span(bytes_).subspan(s.offset, s.length));
    return s;
  }
  /// The whole file, with its trailer. The builder is empty afterwards.
  bytes finish() {
    detail::put_u64(bytes_, checksum(bytes_));
    bytes_.insert(bytes_.end(), reinterpret_cast<const std::byte*>(index_file_end.data()),
                  reinterpret_cast<const std::byte*>(index_file_end.data()) + 8);
    return std::move(bytes_);
  }

 private:
  bytes bytes_;
};

namespace detail {

/// Reads one section, checking each field against the bytes left; errors name `where` and the
/// absolute offset (`base` + position) of the field.
class index_section_reader {
 public:
  index_section_reader(std::span<const std::byte> b,
                       const std::string& where,
                       std::uint64_t base,
                       std::uint64_t block_size,
                       std::size_t nfiles)
      : b_(b), where_(where), base_(base), block_size_(block_size), nfiles_(nfiles) {}

  result<std::pair<std::string, tensor_record>> read() {
    CAIRN_TRY_ASSIGN(std::uint64_t klen, u32());
    if (klen > b_.size() - pos_) return corrupt("key length runs past the section");
    std::string key(reinterpret_cast<const char*>(b_.data() + pos_), klen);
    pos_ += klen;
    tensor_record t;
    CAIRN_TRY_ASSIGN(std::uint8_t type, u8());
    if (type >= all_dtypes.size())
      return corrupt("unknown dtype code " + std::to_string(type), key);
    t.type = static_cast<dtype>(type);
    CAIRN_TRY_ASSIGN(std::uint8_t ndim, u8());
    if (ndim > index_max_axes) return corrupt("too many axes", key);
    CAIRN_TRY_ASSIGN(t.global_shape, ints(ndim));
    if (!checked_numel(t.global_shape, dtype_size(t.type)))
      return corrupt("a negative extent or more than 2^62 bytes", key);
    CAIRN_TRY_ASSIGN(std::uint64_t nchunks, u64());
    // Each chunk takes at least 16 * ndim + 22 bytes: a count larger than the bytes left can
    // hold is a lie, refused before anything is allocated for it.
    if (nchunks > (b_.size() - pos_) / (16 * ndim + 22)) return corrupt("chunk count", key);
    for (std::uint64_t i = 0; i < nchunks; ++i) {
      CAIRN_TRY_ASSIGN(chunk_record c, chunk(key, t));
      t.chunks.push_back(std::move(c));
    }
    if (pos_ != b_.size()) return corrupt("bytes after the last chunk", key);
    return std::pair{std::move(key), std::move(t)};
  }

 private:
  result<chunk_record> chunk(const std::string& key, const tensor_record& t) {
    const std::size_t n = t.global_shape.size();
    chunk_record c;
    const std::uint64_t at = pos_;
    CAIRN_TRY_ASSIGN(c.region.offset, ints(n));
    CAIRN_TRY_ASSIGN(c.region.size, ints(n));
    for (std::size_t a = 0; a < n; ++a)
      if (c.region.offset[a] < 0 || c.region.size[a] < 0 || c.region.size[a] > t.global_shape[a] ||
          c.region.offset[a] > t.global_shape[a] - c.region.size[a])
        return corrupt_at(at, "chunk " + c.region.str() + " lies outside the tensor", key);
    CAIRN_TRY_ASSIGN(std::uint8_t tiled, u8());
    if (tiled > 1 || (tiled && n == 0)) return corrupt("bad tiled flag", key);
    if (tiled) {
      CAIRN_TRY_ASSIGN(c.tiles, ints(n));
      for (std::size_t a = 0; a < n; ++a)
        if (c.tiles[a] < 1 || (c.region.size[a] > 0 && c.tiles[a] > c.region.size[a]) ||
            (c.region.size[a] == 0 && c.tiles[a] != 1))
          return corrupt_at(at, "bad tile counts for chunk " + c.region.str(), key);
    }
    CAIRN_TRY_ASSIGN(std::uint32_t file, u32());
    if (file >= nfiles_) return corrupt("file index " + std::to_string(file), key);
    c.where.file = file;
    CAIRN_TRY_ASSIGN(c.where.byte_offset, u64());
    const std::uint64_t nbytes_at = pos_;
    CAIRN_TRY_ASSIGN(c.where.nbytes, u64());
    if (c.where.nbytes != static_cast<std::uint64_t>(c.region.volume()) * dtype_size(t.type))
      return corrupt_at(
          nbytes_at,
          "chunk " + c.region.str() + " claims " + std::to_string(c.where.nbytes) + " bytes", key);
    CAIRN_TRY_ASSIGN(std::uint8_t compressed, u8());
    if (compressed > 1) return corrupt("bad compressed flag", key);
    const std::uint64_t blocks = chunk_blocks(c, block_size_);
    if (blocks > (b_.size() - pos_) / (compressed ? 24 : 8))
      return corrupt("checksum count of chunk " + c.region.str(), key);
    CAIRN_TRY_ASSIGN(c.where.checksums, u64s(blocks));
    if (compressed) {
      CAIRN_TRY_ASSIGN(c.where.block_offsets, u64s(blocks));
      CAIRN_TRY_ASSIGN(c.where.block_stored, u64s(blocks));
      if (blocks == 0) return corrupt("a compressed chunk without blocks", key);
    }
    return c;
  }

  error corrupt_at(std::uint64_t at, const std::string& msg, const std::string& key = {}) const {
    error e = make_error(errc::corrupt, "malformed index: " + msg).with_file(where_);
    e.offset = base_ + at;
    if (!key.empty()) e.key = key;
    return e;
  }
  error corrupt(const std::string& msg, const std::string& key = {}) const {
    return corrupt_at(pos_, msg, key);
  }
  result<void> need(std::uint64_t n) const {
    if (n > b_.size() - pos_) return corrupt("truncated");
    return ok();
  }
  template <class T>
  result<T> num() {
    CAIRN_TRY(need(sizeof(T)));
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  result<std::uint8_t> u8() { return num<std::uint8_t>(); }
  result<std::uint32_t> u32() { return num<std::uint32_t>(); }
  result<std::uint64_t> u64() { return num<std::uint64_t>(); }
  result<std::vector<std::uint64_t>> u64s(std::uint64_t n) {
    CAIRN_TRY(need(n * 8));  // callers bound n by the bytes left first
    std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
    if (n) std::memcpy(v.data(), b_.data() + pos_, n * 8);
    pos_ += n * 8;
    return v;
  }
  result<shape> ints(std::size_t n) {
    CAIRN_TRY_ASSIGN(auto v, u64s(n));
    return shape(v.begin(), v.end());
  }

  std::span<const std::byte> b_;
  const std::string& where_;
  std::uint64_t base_;
  std::uint64_t block_size_;
  std::size_t nfiles_;
  std::uint64_t pos_ = 0;
};

}  // namespace detail

/// Parses one section (`s` in index file `where`, the bytes at `s.offset`) of a checkpoint with
/// `block_size` and `nfiles` data files, after checking its checksum. Every error is
/// errc::corrupt naming the file and an offset.
inline result<std::pair<std::string, tensor_record>> read_index_section(
    std::span<const std::byte> section,
    const index_section& s,
    const std::string& where,
    std::uint64_t block_size,
    std::size_t nfiles) {
  auto fail = [&](const std::string& msg) {
    error e = make_error(errc::corrupt, msg).with_file(where).with_key(s.key);
    e.offset = s.offset;
    return e;
  };
  if (section.size() != s.length) return fail("malformed index: section is truncated");
  if (checksum(section) != s.checksum)
    return fail("index checksum mismatch: the section of '" + s.key +
                "' was changed or damaged after it was written");
  if (block_size == 0 || block_size > max_block_size) return fail("bad block_size");
  CAIRN_TRY_ASSIGN(
      auto kt, detail::index_section_reader(section, where, s.offset, block_size, nfiles).read());
  if (kt.first != s.key)
    return fail("malformed index: the section names '" + kt.first + "', the manifest '" + s.key +
                "'");
  return kt;
}

/// Checks a whole index file: magic, version and trailer checksum (what `cairn verify` does
/// before it looks at sections). Errors are errc::corrupt naming `where` and an offset.
inline result<void> check_index_file(std::span<const std::byte> file, const std::string& where) {
  auto fail = [&](std::uint64_t at, const std::string& msg) {
    error e = make_error(errc::corrupt, "malformed index: " + msg).with_file(where);
    e.offset = at;
    return e;
  };
  if (file.size() < index_header_bytes + index_trailer_bytes) return fail(0, "file too short");
  if (std::memcmp(file.data(), index_file_magic.data(), 8) != 0) return fail(0, "bad magic");
  std::uint32_t version;
  std::memcpy(&version, file.data() + 8, 4);
  if (version != 4)
    return make_error(errc::unsupported_version,
                      "index file version " + std::to_string(version) + " (this cairn reads 4)")
        .with_file(where);
  const std::size_t body = file.size() - index_trailer_bytes;
  if (std::memcmp(file.data() + body + 8, index_file_end.data(), 8) != 0)
    return fail(body + 8, "bad end marker (truncated?)");
  std::uint64_t want;
  std::memcpy(&want, file.data() + body, 8);
  if (checksum(file.first(body)) != want)
    return fail(body,
                "index checksum mismatch: the file was changed or damaged after it was "
                "written");
  return ok();
}

}  // namespace cairn
