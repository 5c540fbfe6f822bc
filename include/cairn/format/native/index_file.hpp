// cairn/format/native/index_file.hpp: the binary, checksummed index file of format versions 4
// and 5: per tensor a directory and either pages of chunk records (box, tiles, place, checksums)
// or, for a tensor saved as a regular grid of equal boxes (version 5), one packed entry per cell,
// so that metadata.json keeps only tensor-level entries and a loading rank reads only the
// directories of the tensors it needs and the pages or entries that hold the boxes it loads.
//
// Layout, little-endian:
//
//     "CAIRNIDX"  u32 version (4 or 5)  u32 0                 header, 16 bytes
//     directory*                                               one per tensor, back to back
//     (page | entries)*                                        back to back
//     u64 XXH3-64 of every byte before it   "CAIRNEND"         trailer, 16 bytes
//
//     directory = u32 key_len, key bytes (UTF-8), u8 dtype (its position in `all_dtypes`:
//                 bool 0, u8 1, ..., f8_e5m2 14), u8 ndim, i64 shape[ndim],
//                 u64 chunk_count, [u8 layout]                 layout: version 5 only;
//                 layout 0 (and version 4): u64 page_count, page_ref*
//                 layout 1 (a grid):        i64 cell[ndim], u8 tiled, [i64 tiles[ndim]],
//                                           u64 entries_offset, u64 entry_bytes
//     page_ref  = i64 offset[ndim], i64 size[ndim]             a box holding every chunk of the
//                                                              page
//                 u64 chunk_count, u64 offset, u64 length,     where the page lies in the file
//                 u64 XXH3-64 of the page's bytes
//     page      = a section: u32 key_len, key, u8 dtype, u8 ndim, i64 shape[ndim],
//                 u64 chunk_count, chunk*
//     chunk     = i64 offset[ndim], i64 size[ndim], u8 tiled, [i64 tiles[ndim]],
//                 u32 rank, u64 byte_offset, u64 nbytes, u8 compressed,
//                 u64 checksums[blocks], [u64 block_offsets[blocks], u64 block_stored[blocks]]
//     entries   = entry[chunk_count], cells in row-major order of the grid
//     entry     = u32 rank, u64 byte_offset, u64 checksums[blocks],
//                 u64 XXH3-64 of the entry's bytes before it   entry_bytes = 20 + 8 * blocks
//
// `blocks` is the chunk's tile count when tiled, else ceil(nbytes / block_size); `rank` is the
// rank whose data file holds the chunk. A grid's cells all have the shape `cell`, which divides
// the tensor's shape; cell `i` (row-major over shape / cell) is the box at cell-coordinates × cell,
// uncompressed, tiled by `tiles` when tiled. A writer describes a tensor as a grid whenever its
// chunks are one (every equal block sharding, flat optimizer slices that fall on whole rows),
// else sorts its chunks by box offset and cuts them into pages of `index_page_chunks`, so that a
// page's box stays small and a rank that loads one box reads few pages. A grid's entries have one
// size, so a reader reads only the entries of the cells it loads, each checked by its own
// checksum. A directory is found through its (offset, length, XXH3-64) in the manifest, a page
// through its directory, so a reader checks the bytes it reads before it parses them; parsing
// still checks every count and box against what it has read, and every error names the file and
// the offset of the field it could not accept.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/checksum.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
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
/// Chunks per page of an index file (the last page of a tensor may hold fewer).
inline constexpr std::size_t index_page_chunks = 64;
/// The index file version this build writes (5: grid directories). It reads 4 and 5.
inline constexpr std::uint32_t index_file_version = 5;
/// Bytes of a grid entry besides its checksums: rank, byte offset and the entry's own checksum.
inline constexpr std::uint64_t grid_entry_fixed_bytes = 20;

/// Where one tensor's directory (or a page) lies in an index file, and its checksum (what the
/// manifest keeps of a directory).
struct index_section {
  std::string key;
  std::uint64_t offset = 0, length = 0;
  std::uint64_t checksum = 0;  ///< XXH3-64 of the section's bytes
};

/// A page of a tensor's chunks, as its directory describes it.
struct index_page {
  box bounds;  ///< holds every chunk of the page
  std::uint64_t chunks = 0;
  std::uint64_t offset = 0, length = 0;
  std::uint64_t checksum = 0;  ///< XXH3-64 of the page's bytes
};

/// A tensor saved as a regular grid (index file version 5): every chunk is one cell of shape
/// `cell`, and the cells' entries lie back to back at `offset`, `entry_bytes` each.
struct index_grid {
  shape cell;
  tile_counts tiles;  ///< of every cell, or empty
  std::uint64_t offset = 0, entry_bytes = 0;
  /// Cells along each axis (the tensor's shape divided by the cell's).
  shape counts(const shape& global) const;
  /// The box of cell `i` (row-major over `counts`).
  box cell_box(const shape& global, std::uint64_t i) const;
  /// The row-major index of the cell at grid coordinates `at` (each below `counts`' extent).
  static std::uint64_t index_of(const shape& counts, const shape& at);
  /// The grid coordinates of the cell whose box starts at `offset` (a multiple of `cell`).
  shape coords_of(const shape& offset) const;
};

/// A tensor's directory: dtype, shape, and its pages or its grid.
struct index_directory {
  std::string key;
  dtype type = dtype::f32;
  shape global_shape;
  std::uint64_t chunks = 0;  ///< over all pages, or cells of the grid
  std::vector<index_page> pages;
  std::optional<index_grid> grid;  ///< set for a grid (then `pages` is empty)
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
CAIRN_INLINE void put_ints(bytes& b, const shape& s);
CAIRN_INLINE void put_u64s(bytes& b, const std::vector<std::uint64_t>& v);

/// The checksum blocks an extent of a chunk has: its tiles, or one per block_size bytes.
CAIRN_INLINE std::uint64_t chunk_blocks(const chunk_record& c, std::uint64_t block_size);

/// errc::corrupt in index file `where` at byte `offset`, about `key` when not empty.
CAIRN_INLINE error index_error(const std::string& where,
                               std::uint64_t offset,
                               const std::string& key,
                               const std::string& msg);

/// Whether `length` bytes at `offset` lie between the header and the trailer of an index file
/// of `file_size` bytes (and are not empty).
CAIRN_INLINE bool inside_index_body(std::uint64_t offset,
                                    std::uint64_t length,
                                    std::uint64_t file_size);

/// Checks that `bytes` are all of `s` (a directory or page, `what`) and match its checksum.
CAIRN_INLINE result<void> check_section_bytes(std::span<const std::byte> bytes,
                                              const index_section& s,
                                              const std::string& where,
                                              const char* what);

}  // namespace detail

/// The cell shape when `t`'s chunks are a regular grid an index file can describe once: every
/// chunk uncompressed, of one shape dividing the tensor's, at a multiple of it, each cell once,
/// all tiled alike, each with its checksums. Otherwise nothing (the tensor is paged).
CAIRN_INLINE std::optional<shape> regular_grid(const tensor_record& t);

/// The cells of grid directory `d` that meet one of `boxes` (every cell when `boxes` is empty),
/// ascending.
CAIRN_INLINE std::vector<std::uint64_t> grid_cells_meeting(const index_directory& d,
                                                           const std::vector<box>& boxes);

/// Appends tensor `key`'s section to `out`. The record must be consistent (as a save makes
/// it): every chunk has its checksums, and its block offsets when compressed.
CAIRN_INLINE void append_index_section(bytes& out, std::string_view key, const tensor_record& t);

/// A built index file.
struct built_index_file {
  bytes file;
  std::vector<index_section> directories;  ///< where each tensor's directory lies, as added
  std::uint64_t checksum = 0;              ///< of the file before its trailer (the manifest's)
};

/// Builds an index file: `add` tensors, then `finish`.
class index_file_builder {
 public:
  /// Adds tensor `key` (its chunks in the order they should be paged: by box offset).
  void add(std::string key, tensor_record t) {
    tensors_.emplace_back(std::move(key), std::move(t));
  }
  /// The whole file (index file version 5): a grid directory for each tensor whose chunks are
  /// a regular grid (`regular_grid`) unless `grids` is false, pages of `page_chunks` chunks
  /// for the others.
  built_index_file finish(std::size_t page_chunks = index_page_chunks, bool grids = true);

 private:
  /// The smallest box holding every chunk of `t` (an empty box at the origin when none).
  static box bounds_of(const tensor_record& t);
  static std::uint64_t directory_bytes(const std::string& key,
                                       const tensor_record& t,
                                       std::size_t npages,
                                       bool grid);

  std::vector<std::pair<std::string, tensor_record>> tensors_;
};

namespace detail {

/// Reads little-endian fields of an index file's bytes, each checked against the bytes left;
/// errors name `where` and the absolute offset (`base` + position) of the field.
class index_bytes_reader {
 public:
  index_bytes_reader(std::span<const std::byte> b, const std::string& where, std::uint64_t base)
      : b_(b), where_(where), base_(base) {}

 protected:
  error corrupt_at(std::uint64_t at, const std::string& msg, const std::string& key = {}) const {
    return index_error(where_, base_ + at, key, "malformed index: " + msg);
  }
  error corrupt(const std::string& msg, const std::string& key = {}) const {
    return corrupt_at(pos_, msg, key);
  }
  result<void> need(std::uint64_t n) const;
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
  result<std::vector<std::uint64_t>> u64s(std::uint64_t n);
  result<shape> ints(std::size_t n);

  /// The key, dtype and shape that open a directory and a page.
  result<void> key_and_tensor(std::string& key, tensor_record& t);
  /// Whether box `b` lies inside `global`.
  static bool inside(const box& b, const shape& global);

  std::span<const std::byte> b_;
  const std::string& where_;
  std::uint64_t base_;
  std::uint64_t pos_ = 0;
};

/// Reads one section (a page of chunks).
class index_section_reader : index_bytes_reader {
 public:
  index_section_reader(std::span<const std::byte> b,
                       const std::string& where,
                       std::uint64_t base,
                       std::uint64_t block_size,
                       std::size_t nfiles)
      : index_bytes_reader(b, where, base), block_size_(block_size), nfiles_(nfiles) {}

  result<std::pair<std::string, tensor_record>> read();

 private:
  result<chunk_record> chunk(const std::string& key, const tensor_record& t);

  std::uint64_t block_size_;
  std::size_t nfiles_;
};

/// Reads one directory of an index file of `version`; pages and entries must lie inside a file
/// of `file_size` bytes, between its header and trailer.
class index_directory_reader : index_bytes_reader {
 public:
  index_directory_reader(std::span<const std::byte> b,
                         const std::string& where,
                         std::uint64_t base,
                         std::uint64_t file_size,
                         std::uint32_t version)
      : index_bytes_reader(b, where, base), file_size_(file_size), version_(version) {}

  result<index_directory> read();

 private:
  result<void> pages(index_directory& d);
  result<void> grid(index_directory& d);

  std::uint64_t file_size_;
  std::uint32_t version_;
};

}  // namespace detail

/// Parses one section (`s` in index file `where`, the bytes at `s.offset`) of a checkpoint with
/// `block_size` and `nfiles` data files, after checking its checksum. Every error is
/// errc::corrupt naming the file and an offset.
CAIRN_INLINE result<std::pair<std::string, tensor_record>> read_index_section(
    std::span<const std::byte> section,
    const index_section& s,
    const std::string& where,
    std::uint64_t block_size,
    std::size_t nfiles);

/// Parses tensor `s.key`'s directory (the bytes at `s.offset` of index file `where`, which has
/// `file_size` bytes and is of `version`), after checking its checksum. Errors are
/// errc::corrupt naming the file and an offset.
CAIRN_INLINE result<index_directory> read_index_directory(
    std::span<const std::byte> bytes,
    const index_section& s,
    const std::string& where,
    std::uint64_t file_size,
    std::uint32_t version = index_file_version);

/// Parses the entries of cells [`first`, `first` + `count`) of grid directory `d` (their bytes,
/// read from index file `where` at `d.grid->offset + first * d.grid->entry_bytes`) of a
/// checkpoint with `block_size` and `nranks` ranks: each entry's own checksum, its rank, and an
/// entry size that fits the cell's blocks. Returns one chunk per cell.
CAIRN_INLINE result<std::vector<chunk_record>> read_grid_entries(std::span<const std::byte> bytes,
                                                                 const index_directory& d,
                                                                 std::uint64_t first,
                                                                 std::uint64_t count,
                                                                 const std::string& where,
                                                                 std::uint64_t block_size,
                                                                 std::size_t nranks);

/// Parses page `p` of directory `d` (the page's bytes, read from index file `where`) of a
/// checkpoint with `block_size` and `nranks` ranks: its checksum, then its chunks, which must be
/// as many as the directory says, of the directory's tensor, and inside the page's box (readers
/// pick pages by that box).
CAIRN_INLINE result<std::vector<chunk_record>> read_index_page(std::span<const std::byte> bytes,
                                                               const index_directory& d,
                                                               const index_page& p,
                                                               const std::string& where,
                                                               std::uint64_t block_size,
                                                               std::size_t nranks);

/// Checks an index file's header and trailer (its first and last 16 bytes, of a file of
/// `file_size` bytes): magic, `version` (what the manifest's format version implies), end
/// marker. Returns the checksum the trailer holds.
CAIRN_INLINE result<std::uint64_t> check_index_ends(std::span<const std::byte> head,
                                                    std::span<const std::byte> tail,
                                                    std::uint64_t file_size,
                                                    const std::string& where,
                                                    std::uint32_t version = index_file_version);

/// Checks a whole index file of `version`: header, trailer and the checksum of every byte
/// before the trailer (what `cairn verify` does before it looks at directories). Returns that
/// checksum. Errors are errc::corrupt naming `where` and an offset.
CAIRN_INLINE result<std::uint64_t> check_index_file(std::span<const std::byte> file,
                                                    const std::string& where,
                                                    std::uint32_t version = index_file_version);

/// The index file version a checkpoint of native format `version` (4 or later) has.
inline std::uint32_t index_version_of(int version) noexcept { return version >= 5 ? 5 : 4; }

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/index_file-inl.hpp"
#endif
