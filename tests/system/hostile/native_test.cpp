// Hostile native checkpoints: a few hundred bytes of metadata.json that claim terabytes, or
// chunks that overlap and leave gaps, run under a memory and time limit
// (tests/system/hostile/bounded.hpp). Each must end in a clear cairn error, quickly, without
// allocating what it claims — on one rank and on 2 and 3 thread ranks that each load their own
// piece (tests/system/hostile/ranks.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/system/hostile/bounded.hpp"
#include "tests/system/hostile/ranks.hpp"

namespace {

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

/// A small real checkpoint: a [8, 4] f32 tensor on one rank and a common value.
void save_small(cairn::memory_storage& mem) {
  std::vector<float> w(32, 1.5f);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(w), {8, 4}, 0));
  sd.add("step", std::int64_t{7});
  cairn::single_communicator one;
  cairn::save(sd, mem, one);
}

void put_metadata(cairn::memory_storage& mem, const cairn::checkpoint_metadata& m) {
  std::string json = cairn::to_json(m);
  REQUIRE(mem.put("metadata.json", std::as_bytes(std::span(json))));
}

/// The limits every case here runs under: far below what the files claim.
cairn_hostile::bounds tight() {
  cairn_hostile::bounds b;
  b.memory_bytes = std::uint64_t{512} << 20;
  b.seconds = 20;
  return b;
}

/// Loads `t` on 2 and 3 thread ranks in every layout (tests/system/hostile/ranks.hpp): each ends in
/// the same clear error on every rank, or succeeds on every rank (a layout whose pieces avoid
/// the damage may), within the limits.
void check_tight_on_ranks(cairn::storage_ref st, const cairn_hostile::tensor_claim& t) {
  for (const auto& run : cairn_hostile::load_on_ranks(st, t, {2, 3}, {}, tight()))
    CHECK_MESSAGE(run.clean(), run.describe());
}

}  // namespace

TEST_CASE("hostile native: a chunk listed twice and none for the rest, on 1, 2 and 3 ranks") {
  // x of shape [4] saved on two ranks (version 3: the chunks are in metadata.json), then x[0:2]
  // listed twice and x[2:4] nowhere. A 2-rank load whose rank 1 asks for x[2:4] met no chunk
  // there and crashed formatting the names of two chunks of an empty list.
  for (bool sealed : {true, false}) {
    CAPTURE(sealed);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.index_files = false;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<float> buf{1, 2};
      cairn::state_dict sd;
      sd.add("x", cairn::block("x", std::span(buf), {2}, {4}, {2 * comm.rank()}));
      cairn::save(sd, mem, comm, so);
    });
    auto m = cairn::read_metadata(mem).value();
    auto& chunks = m.tensors.at("x").chunks;
    REQUIRE(chunks.size() == 2);
    chunks[1] = chunks[0];
    std::string json = cairn::to_json(m);
    if (!sealed) {  // no metadata_checksum at all: read as an older, unsealed document
      json.resize(json.rfind(cairn::metadata_checksum_member));
      json.resize(json.find_last_not_of(",\n") + 1);
      json += "\n}\n";
    }
    REQUIRE(mem.put("metadata.json", std::as_bytes(std::span(json))));
    const cairn_hostile::tensor_claim x{"x", cairn::dtype::f32, {4}, cairn::box{{2}, {2}}};
    // Every piece meets the gap or the doubled chunk: an integrity error on every rank.
    std::size_t runs = 0;
    for (const auto& run : cairn_hostile::load_on_ranks(mem, x, {1, 2, 3}, {}, tight())) {
      ++runs;
      CHECK_MESSAGE(run.ended.clear_error(), run.describe());
      CHECK_MESSAGE(run.ended.code == cairn::errc::integrity, run.describe());
      CHECK_MESSAGE(run.ended.detail.find("key=x") != std::string::npos, run.describe());
    }
    CHECK(runs >= 9);
    // The layout of the crash itself, by name: rank 0 x[0:2], rank 1 x[2:4].
    cairn_hostile::rank_layout crash{"the crash", {cairn::box{{0}, {2}}, cairn::box{{2}, {2}}}};
    auto r = cairn_hostile::run_bounded([&] { return cairn_hostile::load_pieces(mem, x, crash); },
                                        tight());
    CHECK_MESSAGE(r.clear_error(), r.describe());
    CHECK(r.code == cairn::errc::integrity);
    CHECK_MESSAGE((r.detail.find("no chunk of the checkpoint holds [2:4]") != std::string::npos ||
                   r.detail.find("both hold [0:2]") != std::string::npos),
                  r.describe());
    CHECK(!cairn::verify_checkpoint(mem).value().empty());
    CHECK(!cairn::load_tensors(mem));
  }
}

TEST_CASE("hostile native: a tensor claiming 4 TiB is refused before anything is allocated") {
  cairn::memory_storage mem;
  save_small(mem);
  auto m = cairn::read_metadata(mem).value();
  m.tensors.at("w").global_shape = {std::int64_t{1} << 40};  // [2^40] f32: 4 TiB
  m.tensors.at("w").chunks.at(0).region = cairn::box{{0}, {32}};
  put_metadata(mem, m);
  std::string json(mem.size("metadata.json").value(), '\0');
  REQUIRE(mem.read("metadata.json", 0, std::as_writable_bytes(std::span(json))));
  MESSAGE("metadata.json: " << json.size() << " bytes");
  auto r = cairn_hostile::run_bounded([&] { return cairn::load_tensors(mem); }, tight());
  CHECK_MESSAGE(r.clear_error(), r.describe());
  CHECK(r.code == cairn::errc::integrity);
  auto v = cairn_hostile::run_bounded([&] { return cairn::verify_checkpoint(mem); }, tight());
  CHECK_MESSAGE(v.what == cairn_hostile::outcome::succeeded, v.describe());  // lists problems
  // Ranks asking for pieces inside the one real chunk [0:32], across its end and far past it.
  check_tight_on_ranks(mem, {"w",
                             cairn::dtype::f32,
                             {std::int64_t{1} << 40},
                             cairn::box{{32}, {(std::int64_t{1} << 40) - 32}}});
}

TEST_CASE("hostile native: shapes whose size overflows are corrupt") {
  cairn::memory_storage mem;
  save_small(mem);
  const auto good = cairn::read_metadata(mem).value();
  for (const cairn::shape& s : {cairn::shape{std::int64_t{1} << 62},
                                cairn::shape{std::int64_t{1} << 32, std::int64_t{1} << 32},
                                cairn::shape{std::int64_t{1} << 61, 2, 2}, cairn::shape{-1, 32}}) {
    auto m = good;
    m.tensors.at("w").global_shape = s;
    m.tensors.at("w").chunks.at(0).region = cairn::box{cairn::shape(s.size(), 0), s};
    put_metadata(mem, m);
    auto r = cairn_hostile::run_bounded([&] { return cairn::load_tensors(mem); }, tight());
    CHECK_MESSAGE(r.clear_error(), r.describe());
    CHECK(r.code == cairn::errc::corrupt);
    check_tight_on_ranks(mem, {"w", cairn::dtype::f32, s, std::nullopt});
    check_tight_on_ranks(mem, {"w", cairn::dtype::f32, {8, 4}, std::nullopt});
  }
}

TEST_CASE("hostile native: a common extent claiming 3 GiB in a tiny file ends early") {
  for (bool compressed : {false, true}) {
    CAPTURE(compressed);
    cairn::memory_storage mem;
    save_small(mem);
    auto m = cairn::read_metadata(mem).value();
    REQUIRE(m.common);
    m.block_size = cairn::max_block_size;
    const std::uint64_t claim = 3 * GiB;
    const std::uint64_t blocks = claim / m.block_size;
    cairn::extent& e = *m.common;
    e.nbytes = claim;
    e.checksums.assign(blocks, 0x0123456789abcdefull);
    if (compressed) {
      e.block_offsets.assign(blocks, 0);
      e.block_stored.assign(blocks, 4);  // four bytes that "decompress" to 64 MiB each
    }
    m.files.at(e.file).nbytes = claim;  // the claim; the file really holds a few bytes
    for (auto& [k, c] : m.commons) c.offset = 0;
    put_metadata(mem, m);
    std::string json(mem.size("metadata.json").value(), '\0');
    MESSAGE("metadata.json: " << json.size() << " bytes, claiming a 3 GiB common extent");
    auto r = cairn_hostile::run_bounded([&] { return cairn::load_common(mem); }, tight());
    CHECK_MESSAGE(r.clear_error(), r.describe());
    CHECK(r.code == cairn::errc::corrupt);
    CHECK(r.peak_rss_bytes < 256 * (std::uint64_t{1} << 20));
    check_tight_on_ranks(mem, {"w", cairn::dtype::f32, {8, 4}, std::nullopt});
  }
}

TEST_CASE("hostile native: a block size beyond the bound is corrupt, not a buffer size") {
  cairn::memory_storage mem;
  save_small(mem);
  auto m = cairn::read_metadata(mem).value();
  for (std::uint64_t bs : {std::uint64_t{1} << 40, std::uint64_t{1} << 63, std::uint64_t{0}}) {
    m.block_size = bs;
    put_metadata(mem, m);
    auto r = cairn_hostile::run_bounded(
        [&] {
          std::vector<float> w(32);
          cairn::state_dict sd;
          sd.add("w", cairn::replicated("w", std::span(w), {8, 4}, 0));
          cairn::single_communicator one;
          return cairn::try_load(sd, mem, one);
        },
        tight());
    CHECK_MESSAGE(r.clear_error(), r.describe());
    CHECK(r.code == cairn::errc::corrupt);
    check_tight_on_ranks(mem, {"w", cairn::dtype::f32, {8, 4}, std::nullopt});
  }
}

TEST_CASE("hostile native: a file size claim larger than the file is caught before allocating") {
  cairn::memory_storage mem;
  save_small(mem);
  auto m = cairn::read_metadata(mem).value();
  // Chunks that tile a [2^28, 4] f32 tensor (4 GiB), in a file that claims to be that large.
  auto& t = m.tensors.at("w");
  t.global_shape = {std::int64_t{1} << 28, 4};
  const std::uint64_t bytes = (std::uint64_t{1} << 28) * 16;
  t.chunks.at(0).region = cairn::box{{0, 0}, t.global_shape};
  t.chunks.at(0).tiles.clear();
  t.chunks.at(0).where.nbytes = bytes;
  t.chunks.at(0).where.byte_offset = 0;
  t.chunks.at(0).where.checksums.assign(bytes / m.block_size, 0);
  m.files.at(t.chunks.at(0).where.file).nbytes = bytes;
  put_metadata(mem, m);
  auto r = cairn_hostile::run_bounded([&] { return cairn::load_tensors(mem); }, tight());
  CHECK_MESSAGE(r.clear_error(), r.describe());
  CHECK(r.code == cairn::errc::corrupt);
  CHECK(r.detail.find("truncated") != std::string::npos);
  check_tight_on_ranks(mem, {"w", cairn::dtype::f32, t.global_shape, cairn::box{{8, 0}, {8, 4}}});
}
