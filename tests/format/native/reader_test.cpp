// Format version 4 (`save_options::index_files`): the manifest lists tensors, not chunks; the
// chunks are in binary index files written by the keys' owners. Every byte of the manifest and of
// every index file is covered by a checksum that load and verify check; a section that points
// elsewhere is caught. (Every storage operation of a version 4 save and load failing in every
// way: tests/system/faults/fault_matrix_test.cpp.)
#include <doctest/doctest.h>

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/fault_injection.hpp"

namespace {

constexpr std::int64_t rows = 12, cols = 4;
const char* const keys[] = {"embed", "layer.0.w", "layer.1.w", "head"};

/// One rank's state: four [12, 4] f32 tensors in row blocks, a per-rank object and a step.
struct v4_state {
  std::vector<std::vector<float>> bufs;
  cairn::state_dict sd;
  v4_state(int rank, int world, int gen) {
    const std::int64_t r0 = rows * rank / world, r1 = rows * (rank + 1) / world;
    bufs.resize(std::size(keys));
    for (std::size_t k = 0; k < std::size(keys); ++k) {
      auto& b = bufs[k];
      b.resize(static_cast<std::size_t>((r1 - r0) * cols));
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = gen ? static_cast<float>(gen * 10000 + static_cast<std::int64_t>(k) * 1000 +
                                        r0 * cols + static_cast<std::int64_t>(i))
                   : -1.0f;
      sd.add(keys[k], cairn::block(keys[k], std::span(b), {r1 - r0, cols}, {rows, cols}, {r0, 0}));
    }
    sd.add("step", std::int64_t{gen});
  }
  bool holds(int gen, int rank, int world) const {
    const std::int64_t r0 = rows * rank / world;
    for (std::size_t k = 0; k < bufs.size(); ++k)
      for (std::size_t i = 0; i < bufs[k].size(); ++i)
        if (bufs[k][i] != static_cast<float>(gen * 10000 + static_cast<std::int64_t>(k) * 1000 +
                                             r0 * cols + static_cast<std::int64_t>(i)))
          return false;
    return true;
  }
};

cairn::save_options v4_options(bool overwrite = false) {
  cairn::save_options so;
  so.index_files = true;
  so.block_size = 32;  // tiled chunks: more records per section
  so.overwrite = overwrite;
  return so;
}

void save_gen(cairn::storage_ref st, int world, int gen, cairn::save_options so = v4_options()) {
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    v4_state s(comm.rank(), world, gen);
    cairn::save(s.sd, st, comm, so);
  });
}

/// Loads on `world` ranks: the first error any rank saw, or the generation loaded exactly.
cairn::result<int> load_gen(cairn::storage_ref st, int world, int gen) {
  std::mutex mu;
  std::optional<cairn::error> first;
  bool exact = true;
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    v4_state s(comm.rank(), world, 0);
    auto r = cairn::try_load(s.sd, st, comm);
    std::lock_guard lock(mu);
    if (!r && !first) first = r.err();
    if (r) exact = exact && s.holds(gen, comm.rank(), world);
  });
  if (first) return *first;
  if (!exact) return cairn::make_error(cairn::errc::corrupt, "loaded other values");
  return gen;
}

std::string read_all(cairn::memory_storage& mem, const std::string& name) {
  std::string s(mem.size(name).value(), '\0');
  REQUIRE(mem.read(name, 0, std::as_writable_bytes(std::span(s))));
  return s;
}

void put_all(cairn::memory_storage& mem, const std::string& name, const std::string& s) {
  REQUIRE(mem.put(name, std::as_bytes(std::span(s))));
}

std::vector<std::string> index_files(cairn::memory_storage& mem) {
  std::vector<std::string> out;
  for (const auto& n : mem.list("").value())
    if (n.rfind("index.", 0) == 0) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("version 5: the manifest lists tensors and where their index sections are") {
  cairn::memory_storage mem;
  save_gen(mem, 3, 1);
  const std::string json = read_all(mem, "metadata.json");
  CHECK(json.find("\"version\":5") != std::string::npos);
  CHECK(json.find("\"chunks\":[") == std::string::npos);
  CHECK(json.find("\"role\":\"index\"") != std::string::npos);
  auto manifest = cairn::read_manifest(mem).value();
  CHECK(manifest.index_refs.size() == std::size(keys));
  for (const auto& [k, t] : manifest.tensors) CHECK(t.chunks.empty());
  // Each owner's index file holds the sections of the keys it owns, nothing else.
  std::set<std::string> named;
  for (const auto& [k, ref] : manifest.index_refs) {
    const auto& f = manifest.files.at(ref.file);
    CHECK(f.role == cairn::file_role::index);
    CHECK(f.name == cairn::index_file_name(cairn::owner_of(k, 3), manifest.save_id));
    named.insert(f.name);
  }
  auto on_disk = index_files(mem);
  CHECK(std::set<std::string>(on_disk.begin(), on_disk.end()) == named);
  // The whole metadata has every chunk; loads on 1, 2, 3 and 5 ranks are exact.
  auto whole = cairn::read_metadata(mem).value();
  CHECK(whole.index_refs.empty());
  for (const auto& [k, t] : whole.tensors) CHECK(!t.chunks.empty());
  for (int world : {1, 2, 3, 5}) {
    auto r = load_gen(mem, world, 1);
    INFO("world " << world << ": " << (r ? std::string("ok") : r.err().describe()));
    CHECK(r);
  }
  CHECK(cairn::verify_checkpoint(mem).value().empty());
}

TEST_CASE("version 4: every flipped byte of the manifest or an index file fails load and verify") {
  cairn::memory_storage mem;
  save_gen(mem, 2, 1);
  std::vector<std::string> files = index_files(mem);
  REQUIRE(!files.empty());
  files.push_back("metadata.json");
  std::size_t flips = 0;
  for (const auto& name : files) {
    const std::string good = read_all(mem, name);
    for (std::size_t i = 0; i < good.size(); ++i) {
      for (unsigned char mask : {0x01, 0x80}) {
        std::string bad = good;
        bad[i] = static_cast<char>(bad[i] ^ mask);
        put_all(mem, name, bad);
        INFO(name << " byte " << i << " mask " << int(mask));
        auto r = load_gen(mem, 3, 1);
        REQUIRE(!r);
        CHECK(r.err().describe().find(name) != std::string::npos);
        auto v = cairn::verify_checkpoint(mem);
        REQUIRE(!v);
        CHECK(v.err().describe().find(name) != std::string::npos);
        ++flips;
      }
    }
    put_all(mem, name, good);
  }
  CHECK(load_gen(mem, 3, 1));
  MESSAGE(flips << " flipped bytes, each refused by load and verify");
}

TEST_CASE("version 4: a resealed manifest pointing a section elsewhere is caught") {
  cairn::memory_storage mem;
  save_gen(mem, 2, 1);
  auto good = cairn::read_manifest(mem).value();
  REQUIRE(good.index_refs.size() >= 2);
  // Swap the places of two sections (each one's checksum goes with it): the manifest is
  // consistent with the bytes, but each section names another tensor.
  auto m = good;
  auto a = m.index_refs.begin(), b = std::next(a);
  std::swap(a->second, b->second);
  put_all(mem, "metadata.json", cairn::to_json(m));
  auto r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().message.find("the directory names") != std::string::npos);
  CHECK(!cairn::verify_checkpoint(mem));
  // A chunk count that differs from the section's.
  m = good;
  m.index_refs.begin()->second.chunks += 1;
  put_all(mem, "metadata.json", cairn::to_json(m));
  r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().message.find("chunks, the manifest says") != std::string::npos);
  // A section beyond its file.
  m = good;
  m.index_refs.begin()->second.offset = m.files.at(m.index_refs.begin()->second.file).nbytes;
  put_all(mem, "metadata.json", cairn::to_json(m));
  r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  // A manifest of version 4 without its checksum.
  std::string json = cairn::to_json(good);
  json.resize(json.rfind(cairn::metadata_checksum_member));
  json.resize(json.find_last_of(','));
  json += "\n}\n";
  put_all(mem, "metadata.json", json);
  r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().message.find("without its metadata_checksum") != std::string::npos);
  // Restored, it loads.
  put_all(mem, "metadata.json", cairn::to_json(good));
  CHECK(load_gen(mem, 2, 1));
}

TEST_CASE("version 4: a missing or truncated index file is an error naming it") {
  cairn::memory_storage mem;
  save_gen(mem, 2, 1);
  const auto files = index_files(mem);
  REQUIRE(!files.empty());
  const std::string good = read_all(mem, files[0]);
  put_all(mem, files[0], good.substr(0, good.size() - 5));
  auto r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().describe().find(files[0]) != std::string::npos);
  REQUIRE(mem.remove(files[0]));
  r = load_gen(mem, 2, 1);
  REQUIRE(!r);
  CHECK(r.err().describe().find(files[0]) != std::string::npos);
  CHECK(!cairn::verify_checkpoint(mem));
}

TEST_CASE("version 4: overwriting removes the previous save's index files, v3 and v4 alternate") {
  cairn::memory_storage mem;
  save_gen(mem, 3, 1);
  save_gen(mem, 2, 2, v4_options(true));
  auto m = cairn::read_manifest(mem).value();
  for (const auto& n : index_files(mem)) CHECK(n.find(m.save_id) != std::string::npos);
  CHECK(load_gen(mem, 3, 2));
  cairn::save_options v3 = v4_options(true);
  v3.index_files = false;
  save_gen(mem, 2, 3, v3);
  CHECK(index_files(mem).empty());
  CHECK(cairn::read_manifest(mem).value().version < 4);
  CHECK(load_gen(mem, 1, 3));
  save_gen(mem, 1, 4, v4_options(true));
  CHECK(load_gen(mem, 2, 4));
}

TEST_CASE("version 5: a rank reads a tensor's directory and only the pages or cells it needs") {
  // An [8, 6] f32 tensor in four row chunks of 2 rows: paged 2 chunks a page (rows [0:4] and
  // [4:8]), or described as a grid of four [2, 6] cells.
  cairn::tensor_record t{cairn::dtype::f32, {8, 6}, {}};
  for (std::int64_t r = 0; r < 8; r += 2)
    t.chunks.push_back(cairn::chunk_record{cairn::box{{r, 0}, {2, 6}},
                                           cairn::extent{static_cast<std::uint32_t>(r / 4),
                                                         static_cast<std::uint64_t>(r % 4) * 24,
                                                         48,
                                                         {static_cast<std::uint64_t>(r)}},
                                           {}});
  std::uint64_t read_for_one_row[2] = {};
  for (bool grids : {false, true}) {
    CAPTURE(grids);
    cairn::index_file_builder builder;
    builder.add("w", t);
    auto [file, sections, file_checksum] = builder.finish(2, grids);
    cairn::memory_storage mem;
    REQUIRE(mem.put("index.0.x.cairn", file));
    cairn::checkpoint_metadata m;
    m.version = 5;
    m.world_size = 2;
    m.save_id = "x";
    m.block_size = 64;
    m.files = {{"data.0.x.cairn", 0, 96}, {"data.1.x.cairn", 1, 96}};
    m.files.push_back({"index.0.x.cairn", 0, file.size(), cairn::file_role::index, file_checksum});
    m.tensors["w"] = cairn::tensor_record{cairn::dtype::f32, {8, 6}, {}};
    m.index_refs["w"] =
        cairn::index_ref{2, sections[0].offset, sections[0].length, sections[0].checksum, 4};
    auto rows = [&](std::int64_t r0, std::int64_t r1) {
      cairn::faulty_storage counted(mem);
      auto mm = m;
      REQUIRE(
          cairn::read_index_sections(counted, mm, {{"w", {cairn::box{{r0, 0}, {r1 - r0, 6}}}}}));
      CHECK(mm.index_refs.empty());
      std::vector<cairn::box> got;
      for (const auto& c : mm.tensors.at("w").chunks) got.push_back(c.region);
      return std::pair{got, counted.bytes_read()};
    };
    auto [low, low_bytes] = rows(1, 3);
    CHECK(low == std::vector<cairn::box>{{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}});
    // Rows [6:7]: the second page only (or one cell's entry), and only the chunk that meets it.
    auto [high, high_bytes] = rows(6, 7);
    CHECK(high == std::vector<cairn::box>{{{6, 0}, {2, 6}}});
    read_for_one_row[grids] = high_bytes;
    auto [both, both_bytes] = rows(3, 5);
    CHECK(both == std::vector<cairn::box>{{{2, 0}, {2, 6}}, {{4, 0}, {2, 6}}});
    CHECK(low_bytes <= both_bytes);
    CHECK(high_bytes < both_bytes);
    // The whole tensor: every page or cell; chunks map ranks to the data files.
    auto mm = m;
    REQUIRE(cairn::read_index_sections(mem, mm, {{"w", {}}}));
    REQUIRE(mm.tensors.at("w").chunks.size() == 4);
    CHECK(mm.tensors.at("w").chunks[3].where.file == 1);
    CHECK(mm.tensors.at("w").chunks[3].where.checksums == std::vector<std::uint64_t>{6});
    // A manifest of version 4 names index files of version 4: this one is refused.
    mm = m;
    mm.version = 4;
    auto old = cairn::read_index_sections(mem, mm, {{"w", {}}});
    REQUIRE(!old);
    CHECK(old.err().code == cairn::errc::corrupt);
  }
  // A grid's entry is a fraction of a page of records.
  CHECK(read_for_one_row[1] * 2 < read_for_one_row[0]);
}
