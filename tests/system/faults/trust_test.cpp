// What a hostile or faulty world does to a save or a load, one case each: a lost acknowledgement
// of the commit, chunks that overlap and hide a gap, a shifted chunk offset, a flipped digit in
// metadata.json, sizes beyond what cairn accepts, temp files of killed puts, exceptions thrown
// from user code on one rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "tests/support/test_util.hpp"

namespace {

/// A [rows, 4] f32 tensor split into equal row blocks over `world` ranks; values are
/// `gen * 1000 + flat index`.
struct row_state {
  std::vector<float> buf;
  cairn::state_dict sd;
  row_state(int rank, int world, std::int64_t rows, int gen) {
    std::int64_t n = rows / world;
    buf.resize(static_cast<std::size_t>(n * 4));
    for (std::size_t i = 0; i < buf.size(); ++i)
      buf[i] = static_cast<float>(gen * 1000 + rank * n * 4 + static_cast<std::int64_t>(i));
    sd.add("w", cairn::block("w", std::span(buf), {n, 4}, {rows, 4}, {rank * n, 0}));
    sd.add("step", std::int64_t{gen});
  }
};

/// Saves `row_state` on `world` thread ranks. `index_files = false` writes format version 3,
/// whose chunks are in metadata.json, for the tests that edit them there.
void save_rows(cairn::storage_ref st,
               int world,
               std::int64_t rows,
               int gen,
               bool overwrite,
               bool index_files = true) {
  cairn::save_options so;
  so.overwrite = overwrite;
  so.index_files = index_files;
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    row_state s(comm.rank(), world, rows, gen);
    cairn::save(s.sd, st, comm, so);
  });
}

/// Loads the whole tensor on one rank: the values, or the error.
cairn::result<std::vector<float>> load_rows(cairn::storage_ref st, std::int64_t rows) {
  cairn::single_communicator one;
  row_state s(0, 1, rows, 0);
  auto r = cairn::try_load(s.sd, st, one);
  if (!r) return r.err();
  return s.buf;
}

bool is_gen(const std::vector<float>& v, int gen) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<float>(gen * 1000 + static_cast<std::int64_t>(i))) return false;
  return true;
}

void put_text(cairn::memory_storage& mem, const std::string& name, const std::string& s) {
  REQUIRE(mem.put(name, std::as_bytes(std::span(s))));
}

/// The k (counted from now) at which `faulty` sees the operation `site` (e.g. "put
/// mem://metadata.json") during `run`, found by trying each k with a no-op fault mode.
template <class S, class Run>
std::optional<std::uint64_t> op_index(cairn::faulty_storage<S>& faulty,
                                      const std::string& site,
                                      Run&& run) {
  for (std::uint64_t k = 0; k < 200; ++k) {
    faulty.fail_op(k, cairn::fault_mode::corrupt_read);  // changes nothing but reads
    run();
    if (!faulty.fault_fired()) return std::nullopt;
    if (faulty.fault_site() == site) return k;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("a lost acknowledgement of the commit does not destroy the checkpoint") {
  for (bool overwrite : {false, true}) {
    CAPTURE(overwrite);
    cairn::memory_storage mem;
    cairn::faulty_storage faulty(mem);
    auto reset = [&] {
      std::vector<std::string> names = mem.list("").value();
      for (const auto& n : names) REQUIRE(mem.remove(n));
      if (overwrite) save_rows(mem, 2, 8, 1, false);
    };
    // Where the metadata put falls among the save's storage operations.
    auto k = op_index(faulty, "put mem://metadata.json", [&] {
      reset();
      save_rows(faulty, 2, 8, 2, true);
    });
    REQUIRE(k);
    // Storage performs it and reports failure.
    reset();
    faulty.fail_op(*k, cairn::fault_mode::lost_ack);
    std::mutex mu;
    std::vector<bool> ok;
    cairn::save_options so;
    so.overwrite = true;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      row_state s(comm.rank(), 2, 8, 2);
      auto r = cairn::try_save(s.sd, faulty, comm, so);
      std::lock_guard lock(mu);
      ok.push_back(r.has_value());
    });
    REQUIRE(faulty.fault_fired());
    CHECK(faulty.fault_site() == "put mem://metadata.json");
    // metadata.json is the new one: the save is committed, on every rank, and loads whole.
    CHECK(ok == std::vector<bool>{true, true});
    auto loaded = load_rows(mem, 8);
    REQUIRE(loaded);
    CHECK(is_gen(*loaded, 2));
    CHECK(cairn::verify_checkpoint(mem).value().empty());
  }
}

TEST_CASE("a failed commit leaves no common state or temp file behind") {
  cairn_test::temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::faulty_storage faulty(disk);
  std::uint64_t k = 0;
  {
    cairn_test::temp_dir probe_dir;
    cairn::file_storage probe(probe_dir.path);
    cairn::faulty_storage counter(probe);
    auto at = op_index(counter, "put " + probe.describe("metadata.json"), [&] {
      std::filesystem::remove_all(probe_dir.path);
      save_rows(counter, 2, 8, 1, false);
    });
    REQUIRE(at);
    k = *at;
  }
  faulty.fail_op(k, cairn::fault_mode::fail);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    row_state s(comm.rank(), 2, 8, 1);
    CHECK(!cairn::try_save(s.sd, faulty, comm));
  });
  REQUIRE(faulty.fault_fired());
  std::vector<std::string> left;
  if (std::filesystem::exists(dir.path))
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path))
      if (e.is_regular_file()) left.push_back(e.path().filename().string());
  CHECK(left.empty());
}

TEST_CASE("temp files of killed puts are removed by the next save") {
  cairn_test::temp_dir dir;
  cairn::file_storage disk(dir.path);
  save_rows(disk, 2, 8, 1, false);
  // What a put killed between writing its temporary and renaming it leaves.
  for (const char* name : {".metadata.json.tmp.4242.0123456789abcdef",
                           ".common.0123456789ab.cairn.tmp.7.fedcba9876543210"}) {
    std::ofstream(dir.path / name) << "partial";
  }
  std::ofstream(dir.path / "keep.txt") << "not ours";
  save_rows(disk, 2, 8, 2, true);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  auto m = cairn::read_metadata(disk).value();
  std::vector<std::string> want{"keep.txt", "metadata.json"};
  for (const auto& f : m.files) want.push_back(f.name);
  std::sort(want.begin(), want.end());
  CHECK(names == want);
  auto loaded = load_rows(disk, 8);
  REQUIRE(loaded);
  CHECK(is_gen(*loaded, 2));
}

TEST_CASE("overlapping shards saved without validation cannot hide a gap on load") {
  // Ranks hold x[0:2] and x[1:3] of a [4] tensor: the volumes add up to 4, x[3] is missing.
  cairn::memory_storage mem;
  cairn::save_options so;
  so.validate_access_integrity = false;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> buf{1, 2};
    cairn::state_dict sd;
    sd.add("x", cairn::block("x", std::span(buf), {2}, {4}, {comm.rank()}));
    cairn::save(sd, mem, comm, so);
  });
  cairn::single_communicator one;
  std::vector<float> all(4, -1.0f);
  cairn::state_dict sd;
  sd.add("x", cairn::replicated("x", std::span(all), {4}, 0));
  auto r = cairn::try_load(sd, mem, one);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "x");
  CHECK(r.err().message.find("[0:2] and [1:3] both hold [1:2]") != std::string::npos);
  // A rank that only needs x[0:1] is not affected by the overlap elsewhere.
  std::vector<float> part(1);
  cairn::state_dict one_row;
  one_row.add("x", cairn::block("x", std::span(part), {1}, {4}, {0}));
  CHECK(cairn::try_load(one_row, mem, one));
  CHECK(part[0] == 1.0f);
  auto problems = cairn::verify_checkpoint(mem).value();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].err.code == cairn::errc::integrity);
}

TEST_CASE("a chunk listed twice in metadata.json is an error, not a gap") {
  cairn::memory_storage mem;
  save_rows(mem, 2, 8, 1, false, false);
  auto m = cairn::read_metadata(mem).value();
  auto& chunks = m.tensors.at("w").chunks;
  REQUIRE(chunks.size() == 2);
  chunks[1] = chunks[0];  // rows 0:4 twice, rows 4:8 nowhere
  put_text(mem, "metadata.json", cairn::to_json(m));
  auto r = load_rows(mem, 8);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(!cairn::verify_checkpoint(mem).value().empty());
  CHECK(!cairn::load_tensors(mem));
}

TEST_CASE("a shifted chunk offset is caught by load and verify") {
  // Three chunks of 12 rows; the middle one claims rows 13:25 instead of 12:24.
  cairn::memory_storage mem;
  save_rows(mem, 3, 36, 1, false, false);
  std::string json = cairn_test::read_text(mem, "metadata.json");
  auto at = json.find("\"offset\":[12,0]");
  REQUIRE(at != std::string::npos);
  json[at + 11] = '3';
  // Edited as it is: the document's own checksum no longer matches.
  put_text(mem, "metadata.json", json);
  auto r = load_rows(mem, 36);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().message.find("metadata checksum") != std::string::npos);
  CHECK(!cairn::verify_checkpoint(mem));
  // Resealed, as someone who edits it on purpose would: the chunks no longer tile the tensor.
  put_text(mem, "metadata.json", cairn::reseal_metadata_json(json));
  r = load_rows(mem, 36);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "w");
  auto problems = cairn::verify_checkpoint(mem).value();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].item == "tensor 'w'");
  CHECK(!cairn::load_tensors(mem));
}

TEST_CASE("every flipped byte of metadata.json is caught") {
  for (bool index_files : {true, false}) {
    CAPTURE(index_files);
    cairn::memory_storage mem;
    save_rows(mem, 2, 8, 1, false, index_files);
    const std::string json = cairn_test::read_text(mem, "metadata.json");
    for (std::size_t i = 0; i < json.size(); ++i) {
      std::string bad = json;
      bad[i] = static_cast<char>(bad[i] ^ 0x01);
      put_text(mem, "metadata.json", bad);
      auto r = load_rows(mem, 8);
      if (r) {
        // Only a flip that changes nothing the load uses may load, and then exactly.
        INFO("byte " << i << " '" << json[i] << "' flipped, loaded anyway");
        CHECK(is_gen(*r, 1));
        // Flipping a letter of the checksum's own member name makes it an unknown member.
        CHECK(i >= json.rfind(cairn::metadata_checksum_member));
      }
    }
  }
}

TEST_CASE("sizes beyond what cairn accepts are errors, never overflows") {
  cairn::memory_storage mem;
  save_rows(mem, 2, 8, 1, false, false);
  const auto good = cairn::read_metadata(mem).value();
  auto try_shape = [&](cairn::shape s) {
    auto m = good;
    m.tensors.at("w").global_shape = s;
    put_text(mem, "metadata.json", cairn::to_json(m));
    return cairn::load_tensors(mem);
  };
  for (const auto& s : std::vector<cairn::shape>{
           {std::int64_t{1} << 62, 4}, {std::int64_t{1} << 32, std::int64_t{1} << 32}, {-8, 4}}) {
    auto r = try_shape(s);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::corrupt);
  }
  // A [2^40] tensor whose chunks hold 32 elements: refused before 4 TiB are allocated.
  auto r = try_shape({std::int64_t{1} << 38, 4});
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  // A block size beyond the bound, in a file or in the options.
  auto m = good;
  m.block_size = std::uint64_t{1} << 40;
  put_text(mem, "metadata.json", cairn::to_json(m));
  auto b = load_rows(mem, 8);
  REQUIRE(!b);
  CHECK(b.err().code == cairn::errc::corrupt);
  cairn::single_communicator one;
  row_state s(0, 1, 8, 1);
  cairn::memory_storage other;
  cairn::save_options so;
  so.block_size = cairn::max_block_size + 1;
  auto w = cairn::try_save(s.sd, other, one, so);
  REQUIRE(!w);
  CHECK(w.err().code == cairn::errc::invalid_argument);
}

namespace {
/// An object whose encoding or decoding throws, on the rank that holds `bad`.
struct fragile {
  int bad = 0;
};
}  // namespace

template <>
struct cairn::codec<fragile> {
  static std::vector<std::byte> encode(const fragile& f) {
    if (f.bad == 1) throw std::bad_alloc();
    return {std::byte(f.bad)};
  }
  static cairn::result<void> decode(std::span<const std::byte>, fragile& f) {
    if (f.bad == 2) throw std::runtime_error("decoder exploded");
    return cairn::ok();
  }
};

namespace {
struct fragile_state {
  cairn::sharded_object<fragile> obj;
  static constexpr auto fields = cairn::field_names("obj");
};
}  // namespace

TEST_CASE("exceptions from user code on one rank become the same error on every rank") {
  cairn::memory_storage mem;
  std::mutex mu;
  std::vector<cairn::errc> codes;
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    fragile_state s;
    s.obj = cairn::per_rank("o", fragile{comm.rank() == 1 ? 1 : 0}, comm.rank(), 3);
    cairn::result<cairn::save_stats> r = cairn::make_error(cairn::errc::io, "not run");
    CHECK_NOTHROW(r = cairn::try_save(s, mem, comm));
    REQUIRE(!r);
    std::lock_guard lock(mu);
    codes.push_back(r.err().code);
  });
  CHECK(codes == std::vector<cairn::errc>(3, cairn::errc::resource));
  CHECK(mem.list("").value().empty());
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    fragile_state s;
    s.obj = cairn::per_rank("o", fragile{0}, comm.rank(), 3);
    cairn::save(s, mem, comm);
  });
  codes.clear();
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    fragile_state s;
    s.obj = cairn::per_rank("o", fragile{comm.rank() == 2 ? 2 : 0}, comm.rank(), 3);
    cairn::result<cairn::load_stats> r = cairn::make_error(cairn::errc::io, "not run");
    CHECK_NOTHROW(r = cairn::try_load(s, mem, comm));
    REQUIRE(!r);
    std::lock_guard lock(mu);
    codes.push_back(r.err().code);
  });
  // Rank 2's error, naming rank 2, on every rank: they all take the same branch on its code.
  CHECK(codes == std::vector<cairn::errc>(3, cairn::errc::io));
}
