// cairn/format/native/index_file-inl.hpp: the bodies of cairn/format/native/index_file.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>

#include "cairn/format/native/index_file.hpp"
#include "cairn/plan/box.hpp"

namespace cairn::detail {

CAIRN_INLINE void put_ints(bytes& b, const shape& s) {
  for (std::int64_t v : s) put_u64(b, static_cast<std::uint64_t>(v));
}

CAIRN_INLINE void put_u64s(bytes& b, const std::vector<std::uint64_t>& v) {
  for (std::uint64_t x : v) put_u64(b, x);
}

CAIRN_INLINE std::uint64_t chunk_blocks(const chunk_record& c, std::uint64_t block_size) {
  if (!c.tiles.empty()) return static_cast<std::uint64_t>(tile_count(c.region, c.tiles));
  return c.where.nbytes / block_size + (c.where.nbytes % block_size != 0);
}

CAIRN_INLINE error index_error(const std::string& where,
                               std::uint64_t offset,
                               const std::string& key,
                               const std::string& msg) {
  error e = make_error(errc::corrupt, msg).with_file(where);
  if (!key.empty()) e.key = key;
  e.offset = offset;
  return e;
}

CAIRN_INLINE bool inside_index_body(std::uint64_t offset,
                                    std::uint64_t length,
                                    std::uint64_t file_size) {
  return file_size >= index_header_bytes + index_trailer_bytes && offset >= index_header_bytes &&
         offset <= file_size - index_trailer_bytes && length > 0 &&
         length <= file_size - index_trailer_bytes - offset;
}

CAIRN_INLINE result<void> check_section_bytes(std::span<const std::byte> bytes,
                                              const index_section& s,
                                              const std::string& where,
                                              const char* what) {
  if (bytes.size() != s.length)
    return index_error(where, s.offset, s.key,
                       std::string("malformed index: ") + what + " is truncated");
  if (checksum(bytes) != s.checksum)
    return index_error(where, s.offset, s.key,
                       std::string("index checksum mismatch: the ") + what + " of '" + s.key +
                           "' was changed or damaged after it was written");
  return ok();
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE shape index_grid::counts(const shape& global) const {
  shape n(global.size());
  for (std::size_t a = 0; a < global.size(); ++a) n[a] = cell[a] > 0 ? global[a] / cell[a] : 0;
  return n;
}

CAIRN_INLINE box index_grid::cell_box(const shape& global, std::uint64_t i) const {
  const shape n = counts(global);
  box b{shape(global.size(), 0), cell};
  for (std::size_t a = global.size(); a-- > 0;) {
    const auto na = static_cast<std::uint64_t>(std::max<std::int64_t>(n[a], 1));
    b.offset[a] = static_cast<std::int64_t>(i % na) * cell[a];
    i /= na;
  }
  return b;
}

CAIRN_INLINE std::uint64_t index_grid::index_of(const shape& counts, const shape& at) {
  std::uint64_t i = 0;
  for (std::size_t a = 0; a < counts.size(); ++a)
    i = i * static_cast<std::uint64_t>(counts[a]) + static_cast<std::uint64_t>(at[a]);
  return i;
}

CAIRN_INLINE shape index_grid::coords_of(const shape& offset) const {
  shape at(offset.size());
  for (std::size_t a = 0; a < offset.size(); ++a) at[a] = offset[a] / cell[a];
  return at;
}

CAIRN_INLINE std::optional<shape> regular_grid(const tensor_record& t) {
  if (t.chunks.empty()) return std::nullopt;
  const shape& cell = t.chunks.front().region.size;
  const std::size_t n = t.global_shape.size();
  if (cell.size() != n) return std::nullopt;
  std::uint64_t cells = 1;
  for (std::size_t a = 0; a < n; ++a) {
    if (cell[a] <= 0 || t.global_shape[a] % cell[a] != 0) return std::nullopt;
    cells *= static_cast<std::uint64_t>(t.global_shape[a] / cell[a]);
  }
  if (cells != t.chunks.size()) return std::nullopt;
  const index_grid g{cell, t.chunks.front().tiles};
  const shape counts = g.counts(t.global_shape);
  const std::uint64_t es = dtype_size(t.type);
  std::vector<bool> seen(t.chunks.size());
  for (const chunk_record& c : t.chunks) {
    if (c.region.size != cell || c.tiles != g.tiles || c.where.compressed() ||
        c.where.nbytes != static_cast<std::uint64_t>(c.region.volume()) * es)
      return std::nullopt;
    for (std::size_t a = 0; a < n; ++a)
      if (c.region.offset[a] % cell[a] != 0) return std::nullopt;
    const std::uint64_t i = index_grid::index_of(counts, g.coords_of(c.region.offset));
    if (i >= seen.size() || seen[i]) return std::nullopt;
    seen[i] = true;
  }
  return cell;
}

CAIRN_INLINE std::vector<std::uint64_t> grid_cells_meeting(const index_directory& d,
                                                           const std::vector<box>& boxes) {
  std::vector<std::uint64_t> out;
  if (!d.grid) return out;
  if (boxes.empty()) {
    out.resize(static_cast<std::size_t>(d.chunks));
    for (std::uint64_t i = 0; i < d.chunks; ++i) out[static_cast<std::size_t>(i)] = i;
    return out;
  }
  const shape& cell = d.grid->cell;
  const shape counts = d.grid->counts(d.global_shape);
  const std::size_t n = d.global_shape.size();
  for (const box& w : boxes) {
    if (w.size.size() != n) continue;
    if (n == 0) {  // a scalar: one cell
      out.push_back(0);
      continue;
    }
    auto meets = intersect(w, box{shape(n, 0), d.global_shape});
    if (!meets || meets->volume() == 0) continue;
    // Cell coordinates [lo, hi] along each axis, walked row-major.
    shape lo(n), hi(n);
    for (std::size_t a = 0; a < n; ++a) {
      lo[a] = meets->offset[a] / cell[a];
      hi[a] = (meets->offset[a] + meets->size[a] - 1) / cell[a];
    }
    shape at = lo;
    while (true) {
      out.push_back(index_grid::index_of(counts, at));
      std::size_t a = n;
      while (a > 0 && at[a - 1] == hi[a - 1]) {
        at[a - 1] = lo[a - 1];
        --a;
      }
      if (a == 0) break;
      ++at[a - 1];
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

CAIRN_INLINE void append_index_section(bytes& out, std::string_view key, const tensor_record& t) {
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

CAIRN_INLINE built_index_file index_file_builder::finish(std::size_t page_chunks, bool grids) {
  page_chunks = std::max<std::size_t>(page_chunks, 1);
  // Pages and grid entries first, into their own buffer (offsets relative to its start).
  std::vector<std::vector<index_page>> pages(tensors_.size());
  std::vector<std::optional<index_grid>> grid(tensors_.size());
  bytes body;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& [key, t] = tensors_[i];
    if (auto cell = grids ? regular_grid(t) : std::nullopt) {
      index_grid& g = grid[i].emplace(index_grid{std::move(*cell), t.chunks.front().tiles});
      g.offset = body.size();
      g.entry_bytes = grid_entry_fixed_bytes + 8 * t.chunks.front().where.checksums.size();
      const shape counts = g.counts(t.global_shape);
      std::vector<const chunk_record*> by_cell(t.chunks.size());
      for (const chunk_record& c : t.chunks)
        by_cell[static_cast<std::size_t>(
            index_grid::index_of(counts, g.coords_of(c.region.offset)))] = &c;
      for (const chunk_record* c : by_cell) {
        const std::size_t from = body.size();
        detail::put_u32(body, c->where.file);
        detail::put_u64(body, c->where.byte_offset);
        detail::put_u64s(body, c->where.checksums);
        detail::put_u64(body, checksum(std::span(body).subspan(from)));
      }
      continue;
    }
    for (std::size_t c = 0; c < t.chunks.size() || (c == 0 && t.chunks.empty()); c += page_chunks) {
      tensor_record part{t.type, t.global_shape, {}};
      const std::size_t end = std::min(t.chunks.size(), c + page_chunks);
      part.chunks.assign(t.chunks.begin() + static_cast<std::ptrdiff_t>(c),
                         t.chunks.begin() + static_cast<std::ptrdiff_t>(end));
      index_page p;
      p.bounds = bounds_of(part);
      p.chunks = part.chunks.size();
      p.offset = body.size();
      append_index_section(body, key, part);
      p.length = body.size() - p.offset;
      p.checksum = checksum(std::span(body).subspan(p.offset, p.length));
      pages[i].push_back(std::move(p));
      if (t.chunks.empty()) break;
    }
  }
  // Directories (their size does not depend on the offsets in them).
  std::uint64_t dirs = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    dirs += directory_bytes(tensors_[i].first, tensors_[i].second, pages[i].size(),
                            grid[i].has_value());
  const std::uint64_t first_part = index_header_bytes + dirs;
  bytes out;
  out.insert(out.end(), reinterpret_cast<const std::byte*>(index_file_magic.data()),
             reinterpret_cast<const std::byte*>(index_file_magic.data()) + 8);
  detail::put_u32(out, index_file_version);
  detail::put_u32(out, 0);
  std::vector<index_section> sections;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& [key, t] = tensors_[i];
    index_section s{key, out.size(), 0, 0};
    detail::put_u32(out, static_cast<std::uint32_t>(key.size()));
    const auto* k = reinterpret_cast<const std::byte*>(key.data());
    out.insert(out.end(), k, k + key.size());
    out.push_back(static_cast<std::byte>(t.type));
    out.push_back(static_cast<std::byte>(t.global_shape.size()));
    detail::put_ints(out, t.global_shape);
    detail::put_u64(out, t.chunks.size());
    if (const auto& g = grid[i]) {
      out.push_back(std::byte{1});
      detail::put_ints(out, g->cell);
      out.push_back(std::byte{!g->tiles.empty()});
      detail::put_ints(out, g->tiles);
      detail::put_u64(out, first_part + g->offset);
      detail::put_u64(out, g->entry_bytes);
    } else {
      out.push_back(std::byte{0});
      detail::put_u64(out, pages[i].size());
      for (const index_page& p : pages[i]) {
        detail::put_ints(out, p.bounds.offset);
        detail::put_ints(out, p.bounds.size);
        detail::put_u64(out, p.chunks);
        detail::put_u64(out, first_part + p.offset);
        detail::put_u64(out, p.length);
        detail::put_u64(out, p.checksum);
      }
    }
    s.length = out.size() - s.offset;
    s.checksum = checksum(std::span(out).subspan(s.offset, s.length));
    sections.push_back(std::move(s));
  }
  out.insert(out.end(), body.begin(), body.end());
  const std::uint64_t sum = checksum(out);
  detail::put_u64(out, sum);
  out.insert(out.end(), reinterpret_cast<const std::byte*>(index_file_end.data()),
             reinterpret_cast<const std::byte*>(index_file_end.data()) + 8);
  tensors_.clear();
  return {std::move(out), std::move(sections), sum};
}

CAIRN_INLINE box index_file_builder::bounds_of(const tensor_record& t) {
  const std::size_t n = t.global_shape.size();
  box b{shape(n, 0), shape(n, 0)};
  if (t.chunks.empty()) return b;
  shape lo = t.chunks[0].region.offset, hi = lo;
  for (const auto& c : t.chunks)
    for (std::size_t a = 0; a < n; ++a) {
      lo[a] = std::min(lo[a], c.region.offset[a]);
      hi[a] = std::max(hi[a], c.region.offset[a] + c.region.size[a]);
    }
  for (std::size_t a = 0; a < n; ++a) b.size[a] = hi[a] - lo[a];
  b.offset = std::move(lo);
  return b;
}

CAIRN_INLINE std::uint64_t index_file_builder::directory_bytes(const std::string& key,
                                                               const tensor_record& t,
                                                               std::size_t npages,
                                                               bool grid) {
  const std::uint64_t n = t.global_shape.size();
  const std::uint64_t head = 4 + key.size() + 2 + 8 * n + 8 + 1;
  if (grid) return head + 8 * n + 1 + (t.chunks.front().tiles.empty() ? 0 : 8 * n) + 16;
  return head + 8 + npages * (16 * n + 32);
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<void> index_bytes_reader::need(std::uint64_t n) const {
  if (n > b_.size() - pos_) return corrupt("truncated");
  return ok();
}

CAIRN_INLINE result<std::vector<std::uint64_t>> index_bytes_reader::u64s(std::uint64_t n) {
  CAIRN_TRY(need(n * 8));  // callers bound n by the bytes left first
  std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
  if (n) std::memcpy(v.data(), b_.data() + pos_, n * 8);
  pos_ += n * 8;
  return v;
}

CAIRN_INLINE result<shape> index_bytes_reader::ints(std::size_t n) {
  CAIRN_TRY_ASSIGN(auto v, u64s(n));
  return shape(v.begin(), v.end());
}

CAIRN_INLINE result<void> index_bytes_reader::key_and_tensor(std::string& key, tensor_record& t) {
  CAIRN_TRY_ASSIGN(std::uint64_t klen, u32());
  if (klen > b_.size() - pos_) return corrupt("key length runs past the section");
  key.assign(reinterpret_cast<const char*>(b_.data() + pos_), klen);
  pos_ += klen;
  CAIRN_TRY_ASSIGN(std::uint8_t type, u8());
  if (type >= all_dtypes.size()) return corrupt("unknown dtype code " + std::to_string(type), key);
  t.type = static_cast<dtype>(type);
  CAIRN_TRY_ASSIGN(std::uint8_t ndim, u8());
  if (ndim > index_max_axes) return corrupt("too many axes", key);
  CAIRN_TRY_ASSIGN(t.global_shape, ints(ndim));
  if (!checked_numel(t.global_shape, dtype_size(t.type)))
    return corrupt("a negative extent or more than 2^62 bytes", key);
  return ok();
}

CAIRN_INLINE bool index_bytes_reader::inside(const box& b, const shape& global) {
  for (std::size_t a = 0; a < global.size(); ++a)
    if (b.offset[a] < 0 || b.size[a] < 0 || b.size[a] > global[a] ||
        b.offset[a] > global[a] - b.size[a])
      return false;
  return true;
}

CAIRN_INLINE result<std::pair<std::string, tensor_record>> index_section_reader::read() {
  std::string key;
  tensor_record t;
  CAIRN_TRY(key_and_tensor(key, t));
  const std::size_t ndim = t.global_shape.size();
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

CAIRN_INLINE result<chunk_record> index_section_reader::chunk(const std::string& key,
                                                              const tensor_record& t) {
  const std::size_t n = t.global_shape.size();
  chunk_record c;
  const std::uint64_t at = pos_;
  CAIRN_TRY_ASSIGN(c.region.offset, ints(n));
  CAIRN_TRY_ASSIGN(c.region.size, ints(n));
  if (!inside(c.region, t.global_shape))
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

CAIRN_INLINE result<index_directory> index_directory_reader::read() {
  index_directory d;
  tensor_record t;
  CAIRN_TRY(key_and_tensor(d.key, t));
  d.type = t.type;
  d.global_shape = std::move(t.global_shape);
  CAIRN_TRY_ASSIGN(d.chunks, u64());
  std::uint8_t layout = 0;
  if (version_ >= 5) {
    CAIRN_TRY_ASSIGN(layout, u8());
    if (layout > 1) return corrupt("unknown directory layout " + std::to_string(layout), d.key);
  }
  CAIRN_TRY(layout == 1 ? grid(d) : pages(d));
  if (pos_ != b_.size()) return corrupt("bytes after the directory", d.key);
  return d;
}

CAIRN_INLINE result<void> index_directory_reader::pages(index_directory& d) {
  const std::size_t n = d.global_shape.size();
  CAIRN_TRY_ASSIGN(std::uint64_t npages, u64());
  if (npages > (b_.size() - pos_) / (16 * n + 32)) return corrupt("page count", d.key);
  std::uint64_t chunks = 0;
  for (std::uint64_t i = 0; i < npages; ++i) {
    index_page p;
    const std::uint64_t at = pos_;
    CAIRN_TRY_ASSIGN(p.bounds.offset, ints(n));
    CAIRN_TRY_ASSIGN(p.bounds.size, ints(n));
    if (!inside(p.bounds, d.global_shape))
      return corrupt_at(at, "page box " + p.bounds.str() + " lies outside the tensor", d.key);
    CAIRN_TRY_ASSIGN(p.chunks, u64());
    if (p.chunks > d.chunks - chunks) return corrupt("page chunk count", d.key);
    chunks += p.chunks;
    const std::uint64_t place = pos_;
    CAIRN_TRY_ASSIGN(p.offset, u64());
    CAIRN_TRY_ASSIGN(p.length, u64());
    CAIRN_TRY_ASSIGN(p.checksum, u64());
    if (!inside_index_body(p.offset, p.length, file_size_))
      return corrupt_at(place, "page lies outside the file's body", d.key);
    d.pages.push_back(std::move(p));
  }
  if (chunks != d.chunks) return corrupt("pages hold fewer chunks than the directory says", d.key);
  return ok();
}

CAIRN_INLINE result<void> index_directory_reader::grid(index_directory& d) {
  const std::size_t n = d.global_shape.size();
  index_grid g;
  const std::uint64_t at = pos_;
  CAIRN_TRY_ASSIGN(g.cell, ints(n));
  std::uint64_t cells = 1;
  for (std::size_t a = 0; a < n; ++a) {
    if (g.cell[a] <= 0 || d.global_shape[a] % g.cell[a] != 0)
      return corrupt_at(at, "grid cell does not divide the tensor's shape", d.key);
    cells *= static_cast<std::uint64_t>(d.global_shape[a] / g.cell[a]);  // <= numel < 2^62
  }
  if (cells != d.chunks)
    return corrupt_at(at,
                      "a grid of " + std::to_string(cells) + " cells, the directory says " +
                          std::to_string(d.chunks) + " chunks",
                      d.key);
  CAIRN_TRY_ASSIGN(std::uint8_t tiled, u8());
  if (tiled > 1 || (tiled && n == 0)) return corrupt("bad tiled flag", d.key);
  if (tiled) {
    const std::uint64_t tiles_at = pos_;
    CAIRN_TRY_ASSIGN(g.tiles, ints(n));
    for (std::size_t a = 0; a < n; ++a)
      if (g.tiles[a] < 1 || g.tiles[a] > g.cell[a])
        return corrupt_at(tiles_at, "bad tile counts for the grid's cells", d.key);
  }
  const std::uint64_t place = pos_;
  CAIRN_TRY_ASSIGN(g.offset, u64());
  CAIRN_TRY_ASSIGN(g.entry_bytes, u64());
  if (g.entry_bytes < grid_entry_fixed_bytes + 8 || (g.entry_bytes - grid_entry_fixed_bytes) % 8)
    return corrupt_at(place + 8, "bad grid entry size", d.key);
  if (d.chunks > file_size_ / g.entry_bytes ||
      !inside_index_body(g.offset, d.chunks * g.entry_bytes, file_size_))
    return corrupt_at(place, "grid entries lie outside the file's body", d.key);
  d.grid = std::move(g);
  return ok();
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<std::pair<std::string, tensor_record>> read_index_section(
    std::span<const std::byte> section,
    const index_section& s,
    const std::string& where,
    std::uint64_t block_size,
    std::size_t nfiles) {
  CAIRN_TRY(detail::check_section_bytes(section, s, where, "section"));
  if (block_size == 0 || block_size > max_block_size)
    return detail::index_error(where, s.offset, s.key, "bad block_size");
  CAIRN_TRY_ASSIGN(
      auto kt, detail::index_section_reader(section, where, s.offset, block_size, nfiles).read());
  if (kt.first != s.key)
    return detail::index_error(
        where, s.offset, s.key,
        "malformed index: the section names '" + kt.first + "', the manifest '" + s.key + "'");
  return kt;
}

CAIRN_INLINE result<index_directory> read_index_directory(std::span<const std::byte> bytes,
                                                          const index_section& s,
                                                          const std::string& where,
                                                          std::uint64_t file_size,
                                                          std::uint32_t version) {
  CAIRN_TRY(detail::check_section_bytes(bytes, s, where, "directory"));
  CAIRN_TRY_ASSIGN(
      index_directory d,
      detail::index_directory_reader(bytes, where, s.offset, file_size, version).read());
  if (d.key != s.key)
    return detail::index_error(
        where, s.offset, s.key,
        "malformed index: the directory names '" + d.key + "', the manifest '" + s.key + "'");
  return d;
}

CAIRN_INLINE result<std::vector<chunk_record>> read_index_page(std::span<const std::byte> bytes,
                                                               const index_directory& d,
                                                               const index_page& p,
                                                               const std::string& where,
                                                               std::uint64_t block_size,
                                                               std::size_t nranks) {
  CAIRN_TRY_ASSIGN(auto kt,
                   read_index_section(bytes, index_section{d.key, p.offset, p.length, p.checksum},
                                      where, block_size, nranks));
  auto fail = [&](const std::string& msg) {
    return detail::index_error(where, p.offset, d.key, "malformed index: " + msg);
  };
  if (kt.second.type != d.type || kt.second.global_shape != d.global_shape)
    return fail("a page's dtype or shape differs from its directory's");
  if (kt.second.chunks.size() != p.chunks)
    return fail("a page holds " + std::to_string(kt.second.chunks.size()) +
                " chunks, its directory says " + std::to_string(p.chunks));
  for (const chunk_record& c : kt.second.chunks)
    if (!p.bounds.contains(c.region))
      return fail("chunk " + c.region.str() + " lies outside its page's box " + p.bounds.str());
  return std::move(kt.second.chunks);
}

CAIRN_INLINE result<std::vector<chunk_record>> read_grid_entries(std::span<const std::byte> bytes,
                                                                 const index_directory& d,
                                                                 std::uint64_t first,
                                                                 std::uint64_t count,
                                                                 const std::string& where,
                                                                 std::uint64_t block_size,
                                                                 std::size_t nranks) {
  const index_grid& g = *d.grid;
  const std::uint64_t at = g.offset + first * g.entry_bytes;
  auto fail = [&](std::uint64_t off, const std::string& msg) {
    return detail::index_error(where, off, d.key, "malformed index: " + msg);
  };
  if (first > d.chunks || count > d.chunks - first || g.entry_bytes == 0 ||
      bytes.size() % g.entry_bytes != 0 || bytes.size() / g.entry_bytes != count)
    return fail(at, "grid entries are truncated");
  if (count == 0) return std::vector<chunk_record>{};
  if (block_size == 0 || block_size > max_block_size) return fail(at, "bad block_size");
  chunk_record c;
  c.tiles = g.tiles;
  c.region = g.cell_box(d.global_shape, 0);
  c.where.nbytes = static_cast<std::uint64_t>(c.region.volume()) * dtype_size(d.type);
  const std::uint64_t blocks = detail::chunk_blocks(c, block_size);
  if (g.entry_bytes != grid_entry_fixed_bytes + 8 * blocks)
    return fail(at, "grid entries of " + std::to_string(g.entry_bytes) + " bytes for cells of " +
                        std::to_string(blocks) + " checksum blocks");
  std::vector<chunk_record> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t k = 0; k < count; ++k) {
    const auto e = bytes.subspan(static_cast<std::size_t>(k * g.entry_bytes),
                                 static_cast<std::size_t>(g.entry_bytes));
    const std::uint64_t off = at + k * g.entry_bytes;
    std::uint64_t want;
    std::memcpy(&want, e.data() + e.size() - 8, 8);
    if (checksum(e.first(e.size() - 8)) != want)
      return detail::index_error(where, off, d.key,
                                 "index checksum mismatch: the entry of grid cell " +
                                     std::to_string(first + k) + " of '" + d.key +
                                     "' was changed or damaged after it was written");
    std::uint32_t rank;
    std::memcpy(&rank, e.data(), 4);
    if (rank >= nranks) return fail(off, "file index " + std::to_string(rank));
    c.region = g.cell_box(d.global_shape, first + k);
    c.where.file = rank;
    std::memcpy(&c.where.byte_offset, e.data() + 4, 8);
    c.where.checksums.resize(static_cast<std::size_t>(blocks));
    std::memcpy(c.where.checksums.data(), e.data() + 12, static_cast<std::size_t>(blocks * 8));
    out.push_back(c);
  }
  return out;
}

CAIRN_INLINE result<std::uint64_t> check_index_ends(std::span<const std::byte> head,
                                                    std::span<const std::byte> tail,
                                                    std::uint64_t file_size,
                                                    const std::string& where,
                                                    std::uint32_t expected) {
  auto fail = [&](std::uint64_t at, const std::string& msg) {
    return detail::index_error(where, at, {}, "malformed index: " + msg);
  };
  if (file_size < index_header_bytes + index_trailer_bytes || head.size() < index_header_bytes ||
      tail.size() < index_trailer_bytes)
    return fail(0, "file too short");
  if (std::memcmp(head.data(), index_file_magic.data(), 8) != 0) return fail(0, "bad magic");
  std::uint32_t version, zero;
  std::memcpy(&version, head.data() + 8, 4);
  std::memcpy(&zero, head.data() + 12, 4);
  // The manifest names index files, and it is read first: it says which version they have, and
  // another version here is damage, not a newer writer.
  if (version != expected || zero != 0)
    return fail(8, "bad version " + std::to_string(version) + " (the manifest's format needs " +
                       std::to_string(expected) + ")");
  if (std::memcmp(tail.data() + 8, index_file_end.data(), 8) != 0)
    return fail(file_size - 8, "bad end marker (truncated?)");
  std::uint64_t sum;
  std::memcpy(&sum, tail.data(), 8);
  return sum;
}

CAIRN_INLINE result<std::uint64_t> check_index_file(std::span<const std::byte> file,
                                                    const std::string& where,
                                                    std::uint32_t version) {
  if (file.size() < index_header_bytes + index_trailer_bytes)
    return detail::index_error(where, 0, {}, "malformed index: file too short");
  const std::size_t body = file.size() - index_trailer_bytes;
  CAIRN_TRY_ASSIGN(std::uint64_t want,
                   check_index_ends(file.first(index_header_bytes), file.subspan(body), file.size(),
                                    where, version));
  if (checksum(file.first(body)) != want)
    return detail::index_error(
        where, body, {},
        "index checksum mismatch: the file was changed or damaged after it was written");
  return want;
}

}  // namespace cairn
