// Fuzz target "index": the binary index file of format versions 4 and 5
// (cairn/format/native/index_file.hpp): check_index_file on the input, and read_index_section
// (a page) and read_index_directory (as version 4 and as version 5) on the input as one section
// whose checksum matches it (whoever can rewrite the file can rewrite the checksums that point at
// it), so that mutations reach the field checks, and read_grid_entries on the input as the
// entries of a fixed grid. A page it accepts must encode (append_index_section) to the same
// bytes; a directory it accepts must point inside the file's body with consistent counts.
#include <span>
#include <string>

#include "cairn/format/native/index_file.hpp"
#include "tests/system/fuzz/fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  (void)cairn::check_index_file(in, "fuzz/index.cairn");
  // The key is what the section says (when it can be read), so the key check passes.
  std::string key;
  if (size >= 4) {
    std::uint32_t n = 0;
    std::memcpy(&n, data, 4);
    if (n <= size - 4) key.assign(reinterpret_cast<const char*>(data) + 4, n);
  }
  cairn::index_section s{key, 0, size, cairn::checksum(in)};
  constexpr std::uint64_t file_size = std::uint64_t{1} << 20;
  for (std::uint32_t version : {4u, 5u}) {
    auto d = cairn::read_index_directory(in, s, "fuzz/index.cairn", file_size, version);
    if (!d) continue;
    std::uint64_t chunks = 0;
    for (const auto& p : d->pages) {
      chunks += p.chunks;
      cairn_fuzz::check(p.offset >= cairn::index_header_bytes &&
                            p.offset + p.length <= file_size - cairn::index_trailer_bytes,
                        "an accepted directory points outside the file's body");
      for (std::size_t a = 0; a < d->global_shape.size(); ++a)
        cairn_fuzz::check(p.bounds.offset[a] + p.bounds.size[a] <= d->global_shape[a],
                          "an accepted page box lies outside its tensor");
    }
    if (const auto& g = d->grid) {
      cairn_fuzz::check(version == 5 && d->pages.empty(), "a grid where none can be");
      std::uint64_t cells = 1;
      for (std::size_t a = 0; a < g->cell.size(); ++a) {
        cairn_fuzz::check(g->cell[a] > 0 && d->global_shape[a] % g->cell[a] == 0,
                          "an accepted grid's cell does not divide its tensor");
        cells *= static_cast<std::uint64_t>(d->global_shape[a] / g->cell[a]);
      }
      cairn_fuzz::check(
          g->offset >= cairn::index_header_bytes &&
              g->offset + d->chunks * g->entry_bytes <= file_size - cairn::index_trailer_bytes,
          "an accepted grid's entries lie outside the file's body");
      chunks = cells;
    }
    cairn_fuzz::check(chunks == d->chunks, "an accepted directory miscounts its chunks");
  }
  // The input as the entries of an [8, 6] f32 grid of [2, 6] cells (48 bytes, one block of 64).
  cairn::index_directory grid{"w", cairn::dtype::f32, {8, 6}, 4, {}, {}};
  grid.grid = cairn::index_grid{{2, 6}, {}, cairn::index_header_bytes, 28};
  if (size % 28 == 0 && size / 28 <= 4)
    if (auto e = cairn::read_grid_entries(in, grid, 0, size / 28, "fuzz/index.cairn", 64, 4))
      for (const auto& c : *e)
        cairn_fuzz::check(c.where.file < 4 && c.where.nbytes == 48 && c.where.checksums.size() == 1,
                          "an accepted grid entry is not what its grid says");
  auto r = cairn::read_index_section(in, s, "fuzz/index.cairn", 64, 4);
  if (!r) return 0;
  cairn::bytes again;
  cairn::append_index_section(again, r->first, r->second);
  cairn_fuzz::check(again.size() == size && std::memcmp(again.data(), data, size) == 0,
                    "an accepted index section does not encode to the same bytes");
  return 0;
}
