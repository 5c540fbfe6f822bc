// The binary index file of format versions 4 and 5 (format/native/index_file.hpp): directories,
// pages and grid entries round-trip, and every flipped byte, truncation and lying count is
// refused as corrupt, naming the file and an offset.
#include "cairn/format/native/index_file.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using cairn::box;
using cairn::chunk_record;
using cairn::extent;
using cairn::tensor_record;

constexpr std::uint64_t block = 64;

/// A few tensors covering what a section holds: untiled, tiled, compressed, scalar, empty, and
/// two regular grids (untiled and tiled), listed by box offset as writers list them.
std::vector<std::pair<std::string, tensor_record>> sample_tensors() {
  std::vector<std::pair<std::string, tensor_record>> out;
  {  // [6, 4] f32 as a 3 x 2 grid of [2, 2] cells (16 bytes, one block each) over two ranks
    tensor_record t{cairn::dtype::f32, {6, 4}, {}};
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t c = 0; c < 2; ++c) {
        const auto i = static_cast<std::uint64_t>(r * 2 + c);
        t.chunks.push_back(
            chunk_record{box{{2 * r, 2 * c}, {2, 2}},
                         extent{static_cast<std::uint32_t>(i % 2), 200 + 16 * i, 16, {1000 + i}},
                         {}});
      }
    out.emplace_back("layers.1.weight", std::move(t));
  }
  {  // [4, 8] f32 as two [2, 8] cells, each cut into 1 x 2 tiles (two checksums)
    tensor_record t{cairn::dtype::f32, {4, 8}, {}};
    t.chunks.push_back(chunk_record{box{{0, 0}, {2, 8}}, extent{0, 400, 64, {21, 22}}, {1, 2}});
    t.chunks.push_back(chunk_record{box{{2, 0}, {2, 8}}, extent{1, 400, 64, {23, 24}}, {1, 2}});
    out.emplace_back("layers.1.moment", std::move(t));
  }
  {  // [8, 6] f32 in three row blocks, untiled: 96, 48, 48 bytes
    tensor_record t{cairn::dtype::f32, {8, 6}, {}};
    t.chunks.push_back(chunk_record{box{{0, 0}, {4, 6}}, extent{0, 0, 96, {11, 12}}, {}});
    t.chunks.push_back(chunk_record{box{{4, 0}, {2, 6}}, extent{1, 0, 48, {13}}, {}});
    t.chunks.push_back(chunk_record{box{{6, 0}, {2, 6}}, extent{1, 48, 48, {14}}, {}});
    out.emplace_back("layers.0.weight", std::move(t));
  }
  {  // [4, 16] bf16, one chunk tiled 2 x 2, compressed
    tensor_record t{cairn::dtype::bf16, {4, 16}, {}};
    extent e{0, 96, 128, {1, 2, 3, 4}, {200, 230, 260, 290}, {30, 30, 30, 32}};
    t.chunks.push_back(chunk_record{box{{0, 0}, {4, 16}}, e, {2, 2}});
    out.emplace_back("layers.0.bias", std::move(t));
  }
  {  // a scalar and an empty tensor
    tensor_record s{cairn::dtype::i64, {}, {}};
    s.chunks.push_back(chunk_record{box{{}, {}}, extent{1, 96, 8, {99}}, {}});
    out.emplace_back("step", std::move(s));
    tensor_record z{cairn::dtype::u8, {0, 3}, {}};
    z.chunks.push_back(chunk_record{box{{0, 0}, {0, 3}}, extent{1, 104, 0, {}}, {}});
    out.emplace_back("empty", std::move(z));
  }
  return out;
}

bool same(const tensor_record& a, const tensor_record& b) {
  if (a.type != b.type || a.global_shape != b.global_shape || a.chunks.size() != b.chunks.size())
    return false;
  for (std::size_t i = 0; i < a.chunks.size(); ++i) {
    const auto &x = a.chunks[i], &y = b.chunks[i];
    if (x.region.offset != y.region.offset || x.region.size != y.region.size ||
        x.tiles != y.tiles || x.where.file != y.where.file ||
        x.where.byte_offset != y.where.byte_offset || x.where.nbytes != y.where.nbytes ||
        x.where.checksums != y.where.checksums || x.where.block_offsets != y.where.block_offsets ||
        x.where.block_stored != y.where.block_stored)
      return false;
  }
  return true;
}

using built = cairn::built_index_file;

/// The sample tensors in an index file with pages of 2 chunks (the first tensor gets 2 pages
/// after a third chunk is added), so that pages, not just directories, are exercised.
built build() {
  cairn::index_file_builder builder;
  for (const auto& [k, t] : sample_tensors()) builder.add(k, t);
  return builder.finish(2);
}

std::span<const std::byte> bytes_of(const built& b, std::uint64_t offset, std::uint64_t length) {
  return std::span(b.file).subspan(offset, length);
}

const std::string where = "ckpt/index.0.abc.cairn";

}  // namespace

/// Every chunk of directory `s`, read page by page or from its grid entries.
cairn::result<std::vector<chunk_record>> read_all(std::span<const std::byte> file,
                                                  const cairn::index_section& s) {
  CAIRN_TRY_ASSIGN(
      auto d, cairn::read_index_directory(file.subspan(s.offset, s.length), s, where, file.size()));
  if (d.grid)
    return cairn::read_grid_entries(file.subspan(d.grid->offset, d.chunks * d.grid->entry_bytes), d,
                                    0, d.chunks, where, block, 2);
  std::vector<chunk_record> out;
  for (const auto& p : d.pages) {
    CAIRN_TRY_ASSIGN(
        auto got, cairn::read_index_page(file.subspan(p.offset, p.length), d, p, where, block, 2));
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

TEST_CASE("index file: directories and pages round-trip and the file checks") {
  built b = build();
  REQUIRE(cairn::check_index_file(b.file, where));
  auto tensors = sample_tensors();
  REQUIRE(b.directories.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto d =
        cairn::read_index_directory(bytes_of(b, b.directories[i].offset, b.directories[i].length),
                                    b.directories[i], where, b.file.size());
    REQUIRE(d);
    CHECK(d->key == tensors[i].first);
    CHECK(d->chunks == tensors[i].second.chunks.size());
    // The grids, and the scalar (a grid of one cell), are described once; the others paged.
    const bool grid = tensors[i].first.starts_with("layers.1.") || tensors[i].first == "step";
    CHECK(d->grid.has_value() == grid);
    CHECK(cairn::regular_grid(tensors[i].second).has_value() == grid);
    if (!grid) CHECK(d->pages.size() == (tensors[i].second.chunks.size() + 1) / 2);
    for (const auto& p : d->pages)  // each page's box holds exactly its chunks' boxes
      CHECK(p.bounds.size.size() == tensors[i].second.global_shape.size());
    auto chunks = read_all(b.file, b.directories[i]);
    REQUIRE(chunks);
    tensor_record got{d->type, d->global_shape, *chunks};
    CHECK(same(got, tensors[i].second));
  }
  // The first paged tensor's pages: rows [0:6] and [6:8].
  auto d =
      cairn::read_index_directory(bytes_of(b, b.directories[2].offset, b.directories[2].length),
                                  b.directories[2], where, b.file.size());
  REQUIRE(d);
  REQUIRE(d->pages.size() == 2);
  CHECK(d->pages[0].bounds == box{{0, 0}, {6, 6}});
  CHECK(d->pages[1].bounds == box{{6, 0}, {2, 6}});
  // A page whose box does not hold its chunks is refused (readers pick pages by that box).
  auto p = d->pages[1];
  p.bounds = box{{7, 0}, {1, 6}};
  auto r = cairn::read_index_page(bytes_of(b, p.offset, p.length), *d, p, where, block, 2);
  REQUIRE(!r);
  CHECK(r.err().message.find("outside its page's box") != std::string::npos);
}

TEST_CASE("index file: every flipped byte fails the file check and the directory or page read") {
  built b = build();
  // Where each page lies, from the unchanged directories.
  std::vector<std::pair<cairn::index_directory, cairn::index_page>> pages;
  std::vector<cairn::index_directory> grids;
  for (const auto& s : b.directories) {
    auto d = cairn::read_index_directory(bytes_of(b, s.offset, s.length), s, where, b.file.size());
    REQUIRE(d);
    for (const auto& p : d->pages) pages.emplace_back(*d, p);
    if (d->grid) grids.push_back(*d);
  }
  REQUIRE(grids.size() == 3);
  for (std::size_t at = 0; at < b.file.size(); ++at) {
    for (std::byte mask : {std::byte{0x01}, std::byte{0x80}}) {
      cairn::bytes f = b.file;
      f[at] ^= mask;
      auto whole = cairn::check_index_file(f, where);
      INFO("byte " << at);
      REQUIRE(!whole);
      CHECK(whole.err().file == where);
      CHECK((whole.err().code == cairn::errc::corrupt ||
             whole.err().code == cairn::errc::unsupported_version));
      for (const auto& s : b.directories) {
        if (at < s.offset || at >= s.offset + s.length) continue;
        auto r = cairn::read_index_directory(std::span(f).subspan(s.offset, s.length), s, where,
                                             f.size());
        REQUIRE(!r);
        CHECK(r.err().code == cairn::errc::corrupt);
        CHECK(r.err().file == where);
        CHECK(r.err().offset.has_value());
      }
      for (const auto& [d, p] : pages) {
        if (at < p.offset || at >= p.offset + p.length) continue;
        auto r =
            cairn::read_index_page(std::span(f).subspan(p.offset, p.length), d, p, where, block, 2);
        REQUIRE(!r);
        CHECK(r.err().code == cairn::errc::corrupt);
        CHECK(r.err().file == where);
        CHECK(r.err().offset.has_value());
      }
      for (const auto& d : grids) {  // the entry holding the byte fails its own checksum
        const auto& g = *d.grid;
        if (at < g.offset || at >= g.offset + d.chunks * g.entry_bytes) continue;
        const std::uint64_t cell = (at - g.offset) / g.entry_bytes;
        auto r = cairn::read_grid_entries(
            std::span(f).subspan(g.offset + cell * g.entry_bytes, g.entry_bytes), d, cell, 1, where,
            block, 2);
        REQUIRE(!r);
        CHECK(r.err().code == cairn::errc::corrupt);
        CHECK(r.err().file == where);
        CHECK(*r.err().offset == g.offset + cell * g.entry_bytes);
      }
    }
  }
}

/// Sets every byte of each of `sections` of `b` to a few values in turn, recomputing the
/// section's checksum (whoever can rewrite the file can rewrite the checksums that point at
/// it), and parses it with `read(bytes, section, file)`: a refusal must be errc::corrupt naming
/// the file and an offset inside the section; `accepted(value, file)` checks what parses.
/// Returns how many were refused and how many accepted.
template <class Read, class Accepted>
std::pair<int, int> rewrite_each_byte(const built& b,
                                      const std::vector<cairn::index_section>& sections,
                                      Read read,
                                      Accepted accepted) {
  int refused = 0, took = 0;
  for (const auto& s0 : sections) {
    for (std::size_t at = s0.offset; at < s0.offset + s0.length; ++at) {
      for (std::uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        cairn::bytes f = b.file;
        f[at] = std::byte{v};
        cairn::index_section s = s0;
        auto sec = std::span<const std::byte>(f).subspan(s.offset, s.length);
        s.checksum = cairn::checksum(sec);
        auto r = read(sec, s, f);
        if (!r) {
          ++refused;
          CHECK(r.err().code == cairn::errc::corrupt);
          CHECK(r.err().file == where);
          REQUIRE(r.err().offset.has_value());
          CHECK(*r.err().offset >= s.offset);
          CHECK(*r.err().offset <= s.offset + s.length);
          continue;
        }
        ++took;
        accepted(*r, f);
      }
    }
  }
  return {refused, took};
}

TEST_CASE(
    "index file: a rewritten directory or page with a matching checksum is still checked field "
    "by field") {
  // Parsing must refuse what does not fit (or accept something consistent), never crash or
  // over-allocate.
  built b = build();
  auto [refused, accepted] = rewrite_each_byte(
      b, b.directories,
      [](auto sec, const cairn::index_section& s, const cairn::bytes& f) {
        return cairn::read_index_directory(sec, s, where, f.size());
      },
      [](const cairn::index_directory& d, const cairn::bytes& f) {
        std::uint64_t chunks = 0;
        if (const auto& g = d.grid) {  // a grid: its cells divide the tensor, entries inside
          std::uint64_t cells = 1;
          for (std::size_t a = 0; a < g->cell.size(); ++a) {
            REQUIRE(g->cell[a] > 0);
            CHECK(d.global_shape[a] % g->cell[a] == 0);
            cells *= static_cast<std::uint64_t>(d.global_shape[a] / g->cell[a]);
          }
          CHECK(cells == d.chunks);
          CHECK(g->offset >= cairn::index_header_bytes);
          CHECK(g->offset + d.chunks * g->entry_bytes <= f.size() - cairn::index_trailer_bytes);
          chunks = d.chunks;
        }
        for (const auto& p : d.pages) {  // what is accepted is consistent
          chunks += p.chunks;
          CHECK(p.offset >= cairn::index_header_bytes);
          CHECK(p.offset + p.length <= f.size() - cairn::index_trailer_bytes);
          for (std::size_t a = 0; a < p.bounds.size.size(); ++a)
            CHECK(p.bounds.offset[a] + p.bounds.size[a] <= d.global_shape[a]);
        }
        CHECK(chunks == d.chunks);
      });
  CHECK(refused > 0);
  CHECK(accepted > 0);  // e.g. a changed page checksum or box parses
}

TEST_CASE("index file: a rewritten page with a matching checksum is still checked field by field") {
  built b = build();
  std::vector<cairn::index_section> pages;
  for (const auto& s : b.directories) {
    auto d = cairn::read_index_directory(bytes_of(b, s.offset, s.length), s, where, b.file.size());
    REQUIRE(d);
    for (const auto& p : d->pages) pages.push_back({s.key, p.offset, p.length, p.checksum});
  }
  auto [refused, accepted] = rewrite_each_byte(
      b, pages,
      [](auto sec, const cairn::index_section& s, const cairn::bytes&) {
        return cairn::read_index_section(sec, s, where, block, 2);
      },
      [](const std::pair<std::string, cairn::tensor_record>& kt, const cairn::bytes&) {
        for (const auto& c : kt.second.chunks) {  // what is accepted is consistent
          CHECK(c.where.file < 2);
          CHECK(c.where.nbytes ==
                static_cast<std::uint64_t>(c.region.volume()) * cairn::dtype_size(kt.second.type));
          for (std::size_t a = 0; a < c.region.size.size(); ++a)
            CHECK(c.region.offset[a] + c.region.size[a] <= kt.second.global_shape[a]);
        }
      });
  CHECK(refused > 0);
  CHECK(accepted > 0);  // e.g. a changed checksum value or byte offset parses
}

TEST_CASE("index file: truncations and lying counts are refused") {
  built b = build();
  for (std::size_t n = 0; n < b.file.size(); ++n)
    CHECK(!cairn::check_index_file(std::span(b.file).first(n), where));
  const auto& s = b.directories[2];
  auto d = cairn::read_index_directory(bytes_of(b, s.offset, s.length), s, where, b.file.size());
  REQUIRE(d);
  const auto& p = d->pages[0];
  for (std::size_t n = 0; n < s.length; ++n) {
    auto sec = std::span(b.file).subspan(s.offset, n);
    cairn::index_section t = s;
    t.length = n;
    t.checksum = cairn::checksum(sec);
    CHECK(!cairn::read_index_directory(sec, t, where, b.file.size()));
  }
  for (std::size_t n = 0; n < p.length; ++n) {
    auto sec = std::span(b.file).subspan(p.offset, n);
    cairn::index_section t{s.key, p.offset, n, cairn::checksum(sec)};
    CHECK(!cairn::read_index_section(sec, t, where, block, 2));
  }
  // A directory whose pages lie past the end of the file: refused.
  CHECK(!cairn::read_index_directory(bytes_of(b, s.offset, s.length), s, where, p.offset));
  // A section claiming 2^60 chunks in a few bytes: refused before allocating anything.
  cairn::bytes sec;
  cairn::tensor_record t{cairn::dtype::f32, {4}, {}};
  cairn::append_index_section(sec, "w", t);
  std::uint64_t lie = std::uint64_t{1} << 60;
  std::memcpy(sec.data() + sec.size() - 8, &lie, 8);
  cairn::index_section lying{"w", 0, sec.size(), cairn::checksum(sec)};
  auto r = cairn::read_index_section(sec, lying, where, block, 1);
  REQUIRE(!r);
  CHECK(r.err().message.find("chunk count") != std::string::npos);
  // The manifest names another key than the section: refused.
  cairn::index_section other{"v", 0, sec.size(), cairn::checksum(sec)};
  tensor_record good{cairn::dtype::f32, {4}, {}};
  cairn::bytes sec2;
  cairn::append_index_section(sec2, "w", good);
  other.length = sec2.size();
  other.checksum = cairn::checksum(sec2);
  CHECK(!cairn::read_index_section(sec2, other, where, block, 1));
}

TEST_CASE("index file: a grid's entries are read cell by cell, and lies about them are refused") {
  built b = build();
  const auto& s = b.directories[0];  // the 3 x 2 grid of [2, 2] cells
  auto d = cairn::read_index_directory(bytes_of(b, s.offset, s.length), s, where, b.file.size());
  REQUIRE(d);
  REQUIRE(d->grid);
  const cairn::index_grid g = *d->grid;
  CHECK(g.cell == cairn::shape{2, 2});
  CHECK(g.entry_bytes == cairn::grid_entry_fixed_bytes + 8);
  // The cells a box meets, and only their entries read.
  CHECK(cairn::grid_cells_meeting(*d, {box{{2, 1}, {2, 2}}}) == std::vector<std::uint64_t>{2, 3});
  CHECK(cairn::grid_cells_meeting(*d, {box{{5, 3}, {1, 1}}, box{{0, 0}, {1, 1}}}) ==
        std::vector<std::uint64_t>{0, 5});
  CHECK(cairn::grid_cells_meeting(*d, {}).size() == 6);
  auto r = cairn::read_grid_entries(bytes_of(b, g.offset + 3 * g.entry_bytes, g.entry_bytes), *d, 3,
                                    1, where, block, 2);
  REQUIRE(r);
  REQUIRE(r->size() == 1);
  const chunk_record& c = r->front();
  CHECK(c.region == box{{2, 2}, {2, 2}});
  CHECK(c.where.file == 1);
  CHECK(c.where.byte_offset == 200 + 16 * 3);
  CHECK(c.where.nbytes == 16);
  CHECK(c.where.checksums == std::vector<std::uint64_t>{1003});
  // A rank past the checkpoint's ranks, a block size that gives another entry size, bytes
  // short of the cells asked for: refused, naming the file and the entry's offset.
  CHECK(!cairn::read_grid_entries(bytes_of(b, g.offset + 3 * g.entry_bytes, g.entry_bytes), *d, 3,
                                  1, where, block, 1));
  CHECK(!cairn::read_grid_entries(bytes_of(b, g.offset + 3 * g.entry_bytes, g.entry_bytes), *d, 3,
                                  1, where, 8, 2));
  CHECK(!cairn::read_grid_entries(bytes_of(b, g.offset, g.entry_bytes), *d, 0, 2, where, block, 2));
  CHECK(!cairn::read_grid_entries(bytes_of(b, g.offset, g.entry_bytes), *d, 6, 1, where, block, 2));
  CHECK(cairn::read_grid_entries({}, *d, 6, 0, where, block, 2).value().empty());
  // A grid over a tensor with an empty axis has no cell: a directory claiming one is refused.
  cairn::tensor_record hollow{cairn::dtype::f32, {0, 4}, {}};
  hollow.chunks.push_back(chunk_record{box{{0, 0}, {0, 4}}, extent{0, 0, 0, {}}, {}});
  CHECK(!cairn::regular_grid(hollow));
  // Chunks that are not a grid stay paged: unequal cells, a gap, a duplicate, compression.
  auto t = sample_tensors()[0].second;
  CHECK(cairn::regular_grid(t));
  auto bent = t;
  bent.chunks[1].region.offset = {0, 3};
  CHECK(!cairn::regular_grid(bent));
  auto twice = t;
  twice.chunks[1].region = twice.chunks[0].region;
  CHECK(!cairn::regular_grid(twice));
  auto fewer = t;
  fewer.chunks.pop_back();
  CHECK(!cairn::regular_grid(fewer));
  // Without grids every tensor is paged; with them the grid's index is smaller.
  cairn::index_file_builder paged;
  for (const auto& [k, tr] : sample_tensors()) paged.add(k, tr);
  built p = paged.finish(2, false);
  auto pd =
      cairn::read_index_directory(bytes_of(p, p.directories[0].offset, p.directories[0].length),
                                  p.directories[0], where, p.file.size());
  REQUIRE(pd);
  CHECK(!pd->grid);
  CHECK(p.file.size() > b.file.size());
  // A file of another version than the manifest's format says is refused.
  auto v4 = cairn::check_index_file(b.file, where, 4);
  REQUIRE(!v4);
  CHECK(v4.err().message.find("bad version 5") != std::string::npos);
}
