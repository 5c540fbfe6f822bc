// safetensors_as_metadata (format/safetensors/reader.hpp): one model.safetensors, an index and
// the files it names, or DCP's sharded files (DCP_SHARDING_INFO, no index), described as cairn
// metadata (one chunk per tensor or piece at its byte offset), and the errors of missing files,
// tensors in two files, pieces that disagree and hostile headers.
#include "cairn/format/safetensors/reader.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/foreign.hpp"

namespace safetensors_reader_test {

namespace sf = cairn::safetensors;

/// Writes safetensors file `name` holding f32 tensors `keys`, each [2, 2] with values
/// `base + key index * 4 + element`.
inline void put_file(cairn::storage_ref st,
                     const std::string& name,
                     const std::vector<std::string>& keys,
                     float base,
                     std::map<std::string, std::string> meta = {}) {
  std::vector<std::vector<float>> data;
  std::vector<sf::tensor_view> views;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    data.emplace_back(4);
    std::iota(data.back().begin(), data.back().end(), base + static_cast<float>(i * 4));
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    views.push_back({keys[i], cairn::dtype::f32, {2, 2}, std::as_bytes(std::span(data[i]))});
  sf::write_file(st, name, views, std::move(meta)).value();
}

/// Writes `name` as one rank's file of DCP's HuggingFaceStorageWriter(save_distributed=True):
/// f32 pieces `{key, dims}` of consecutive values from `first`, and `sharding` as the
/// `DCP_SHARDING_INFO` entry of `__metadata__` (none when empty).
inline void put_piece_file(cairn::storage_ref st,
                           const std::string& name,
                           const std::vector<std::pair<std::string, cairn::shape>>& pieces,
                           float first,
                           const std::string& sharding) {
  std::vector<std::vector<float>> data;
  std::vector<sf::tensor_view> views;
  for (const auto& [key, dims] : pieces) {
    data.emplace_back(static_cast<std::size_t>(cairn::numel(dims)));
    std::iota(data.back().begin(), data.back().end(), first);
    first += static_cast<float>(data.back().size());
  }
  for (std::size_t i = 0; i < pieces.size(); ++i)
    views.push_back(
        {pieces[i].first, cairn::dtype::f32, pieces[i].second, std::as_bytes(std::span(data[i]))});
  std::map<std::string, std::string> meta{{"format", "pt"}, {"DCP_VERSION", "1.0"}};
  if (!sharding.empty()) meta.emplace("DCP_SHARDING_INFO", sharding);
  sf::write_file(st, name, views, std::move(meta)).value();
}

/// DCP's sharded output of w [3, 4] = 0..11 (rows 0-1 from rank 1, row 2 from rank 2) and
/// b [4] = 100..103 (replicated, saved once by rank 2), as torch 2.14 names the files.
inline void put_dcp_shards(cairn::storage_ref st) {
  put_piece_file(st, "shard-00001-model-00001-of-00001.safetensors", {{"w", {2, 4}}}, 0.0f,
                 R"({"w": {"saved_offsets": [0, 0]}})");
  put_piece_file(st, "shard-00002-model-00001-of-00001.safetensors", {{"w", {1, 4}}}, 8.0f,
                 R"({"w": {"saved_offsets": [2, 0]}})");
  put_piece_file(st, "shard-00002-model-00002-of-00002.safetensors", {{"b", {4}}}, 100.0f,
                 R"({"b": {"saved_offsets": [0]}})");
}

inline void put_index(cairn::storage_ref st, std::map<std::string, std::string> weight_map) {
  sf::index ix;
  ix.weight_map = std::move(weight_map);
  ix.total_size = 16 * ix.weight_map.size();
  sf::write_index(st, sf::index_name, ix).value();
}

/// A file of raw bytes: an 8-byte little-endian header length `len`, then `body`.
inline void put_raw(cairn::memory_storage& mem, std::uint64_t len, const std::string& body) {
  std::string f;
  cairn::format_detail::put_le(f, len, 8);
  f += body;
  mem.put("model.safetensors", cairn::format_detail::as_bytes(f)).value();
}

}  // namespace safetensors_reader_test

TEST_CASE("safetensors_as_metadata: one file, each tensor one whole chunk at its bytes") {
  cairn::memory_storage mem;
  safetensors_reader_test::put_file(mem, "model.safetensors", {"b", "a"}, 1.0f,
                                    {{"format", "pt"}, {"step", "7"}});
  auto m = cairn::safetensors_as_metadata(mem).value();
  CHECK(m.format == "safetensors");
  CHECK(!m.verified());
  CHECK(m.block_size == cairn::foreign_read_block);
  CHECK(m.content_metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}});
  REQUIRE(m.files.size() == 1);
  CHECK(m.files[0].name == "model.safetensors");
  CHECK(m.files[0].nbytes == mem.size("model.safetensors").value());
  auto h = cairn::safetensors::read_header(mem, "model.safetensors").value();
  REQUIRE(m.tensors.size() == 2);
  for (const char* k : {"a", "b"}) {
    INFO(k);
    const auto& t = m.tensors.at(k);
    CHECK(t.type == cairn::dtype::f32);
    CHECK(t.global_shape == cairn::shape{2, 2});
    REQUIRE(t.chunks.size() == 1);
    CHECK(t.chunks[0].region.offset == cairn::shape{0, 0});
    CHECK(t.chunks[0].region.size == cairn::shape{2, 2});
    CHECK(t.chunks[0].where.file == 0);
    CHECK(t.chunks[0].where.byte_offset == h.find(k)->file_offset());
    CHECK(t.chunks[0].where.nbytes == 16);
    CHECK(t.chunks[0].where.checksums.empty());
  }
  // The byte offsets are right: the values read back are the ones written.
  std::vector<float> got(4);
  mem.read("model.safetensors", m.tensors.at("a").chunks[0].where.byte_offset,
           std::as_writable_bytes(std::span(got)))
      .value();
  CHECK(got == std::vector<float>{5.0f, 6.0f, 7.0f, 8.0f});  // "a" was written second
}

TEST_CASE("safetensors_as_metadata: an index names the files, each tensor points at its own") {
  cairn::memory_storage mem;
  safetensors_reader_test::put_file(mem, "part-2.safetensors", {"x", "y"}, 100.0f);
  safetensors_reader_test::put_file(mem, "part-1.safetensors", {"a"}, 0.0f);
  safetensors_reader_test::put_index(
      mem, {{"a", "part-1.safetensors"}, {"x", "part-2.safetensors"}, {"y", "part-2.safetensors"}});
  auto m = cairn::safetensors_as_metadata(mem).value();
  REQUIRE(m.files.size() == 2);  // each file once, in the order the index first names it
  CHECK(m.files[0].name == "part-1.safetensors");
  CHECK(m.files[1].name == "part-2.safetensors");
  CHECK(m.tensors.at("a").chunks[0].where.file == 0);
  CHECK(m.tensors.at("x").chunks[0].where.file == 1);
  CHECK(m.tensors.at("y").chunks[0].where.file == 1);

  // load reads it: "y" comes from the second file.
  std::vector<float> y(4, 0.0f);
  cairn::state_dict sd;
  sd.add("y", cairn::from_rank_offsets("y", std::span(y), {2, 2}, {}));
  cairn::single_communicator one;
  cairn::load(sd, mem, one);
  CHECK(y == std::vector<float>{104.0f, 105.0f, 106.0f, 107.0f});
}

TEST_CASE("safetensors_as_metadata: missing files and a tensor in two files fail by name") {
  cairn::memory_storage mem;
  SUBCASE("nothing there") {
    auto r = cairn::safetensors_as_metadata(mem);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::incomplete_checkpoint);
    CHECK(r.err().message.find("model.safetensors") != std::string::npos);
  }
  SUBCASE("the index names a file that is not there") {
    safetensors_reader_test::put_file(mem, "one.safetensors", {"a"}, 0.0f);
    safetensors_reader_test::put_index(mem, {{"a", "one.safetensors"}, {"b", "two.safetensors"}});
    auto r = cairn::safetensors_as_metadata(mem);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::not_found);
    CHECK(r.err().file.find("two.safetensors") != std::string::npos);
  }
  SUBCASE("two files hold the same tensor") {
    safetensors_reader_test::put_file(mem, "one.safetensors", {"a", "w"}, 0.0f);
    safetensors_reader_test::put_file(mem, "two.safetensors", {"w"}, 0.0f);
    safetensors_reader_test::put_index(mem, {{"a", "one.safetensors"}, {"w", "two.safetensors"}});
    auto r = cairn::safetensors_as_metadata(mem);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::corrupt);
    CHECK(r.err().key == "w");
    CHECK(r.err().file.find("two.safetensors") != std::string::npos);
  }
  SUBCASE("the index is not JSON") {
    std::string junk = "{\"weight_map\": [";
    mem.put(cairn::safetensors::index_name, std::as_bytes(std::span(junk))).value();
    auto r = cairn::safetensors_as_metadata(mem);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::corrupt);
    CHECK(r.err().file.find(cairn::safetensors::index_name) != std::string::npos);
  }
}

TEST_CASE("safetensors_as_metadata refuses hostile headers naming the file") {
  cairn::memory_storage mem;
  SUBCASE("shorter than the length field") {
    std::string s = "abc";
    mem.put("model.safetensors", std::as_bytes(std::span(s))).value();
  }
  SUBCASE("a header length past the end of the file") {
    safetensors_reader_test::put_raw(mem, 1000, "{}");
  }
  SUBCASE("a header length near 2^64") {
    safetensors_reader_test::put_raw(mem, ~std::uint64_t{0} - 3, "{}      ");
  }
  SUBCASE("data offsets past the end of the file") {
    std::string json = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    safetensors_reader_test::put_raw(mem, json.size(), json + std::string(8, '\0'));
  }
  SUBCASE("a shape whose bytes overflow") {
    std::string json =
        R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
    safetensors_reader_test::put_raw(mem, json.size(), json);
  }
  auto r = cairn::safetensors_as_metadata(mem);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().file == mem.describe("model.safetensors"));
}

TEST_CASE("safetensors_as_metadata: DCP's sharded files, each piece where DCP_SHARDING_INFO says") {
  cairn::memory_storage mem;
  safetensors_reader_test::put_dcp_shards(mem);
  CHECK(cairn::detect_format(mem).value() == "safetensors");
  auto m = cairn::safetensors_as_metadata(mem).value();
  REQUIRE(m.files.size() == 3);
  const auto& w = m.tensors.at("w");
  CHECK(w.global_shape == cairn::shape{3, 4});  // the extent of its pieces
  REQUIRE(w.chunks.size() == 2);
  CHECK(w.chunks[1].region.offset == cairn::shape{2, 0});
  CHECK(w.chunks[1].region.size == cairn::shape{1, 4});
  CHECK(m.tensors.at("b").global_shape == cairn::shape{4});
  CHECK(m.content_metadata.count("DCP_SHARDING_INFO") == 0);  // per file, not the checkpoint's
  CHECK(m.content_metadata.at("format") == "pt");
  CHECK(cairn::verify_any(mem).value().problems.empty());

  // load reads columns 1-2 of every row across both pieces, and b whole.
  std::vector<float> cols(6, -1.0f), b(4, -1.0f);
  cairn::sharded_tensor<> x;
  x.key = "w";
  x.type = cairn::dtype::f32;
  x.local_shape = {3, 2};
  x.global_shape = {3, 4};
  x.global_offset = {0, 1};
  x.data = std::as_writable_bytes(std::span(cols));
  cairn::state_dict sd;
  sd.add("w", x);
  sd.add("b", cairn::from_rank_offsets("b", std::span(b), {4}, {}));
  cairn::single_communicator one;
  cairn::load(sd, mem, one);
  CHECK(cols == std::vector<float>{1, 2, 5, 6, 9, 10});
  CHECK(b == std::vector<float>{100, 101, 102, 103});
}

TEST_CASE("safetensors_as_metadata: DCP's sharded files that disagree fail by key and file") {
  cairn::memory_storage mem;
  namespace t = safetensors_reader_test;
  std::string file = "shard-00001-model-00001-of-00001.safetensors";
  cairn::errc code = cairn::errc::corrupt;
  std::string key = "w";
  SUBCASE("a file without DCP_SHARDING_INFO: an unfinished save of HF's layout") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, "");
    code = cairn::errc::incomplete_checkpoint;
    key = "";
  }
  SUBCASE("offsets of another rank than the piece") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, R"({"w": {"saved_offsets": [0]}})");
  }
  SUBCASE("a negative offset") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, R"({"w": {"saved_offsets": [-2, 0]}})");
  }
  SUBCASE("an offset that overflows with the piece's extent") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f,
                      R"({"w": {"saved_offsets": [9223372036854775807, 0]}})");
  }
  SUBCASE("no saved_offsets") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, R"({"w": {"offsets": [0, 0]}})");
  }
  SUBCASE("not JSON") {
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, R"({"w": {"saved_offsets": [0, )");
    key = "DCP_SHARDING_INFO";
  }
  SUBCASE("a piece with another number of dimensions than the others") {
    t::put_piece_file(mem, "shard-00000-model-00001-of-00001.safetensors", {{"w", {2}}}, 0.0f,
                      R"({"w": {"saved_offsets": [0]}})");
    t::put_piece_file(mem, file, {{"w", {2, 4}}}, 0.0f, R"({"w": {"saved_offsets": [2, 0]}})");
  }
  auto r = cairn::safetensors_as_metadata(mem);
  REQUIRE(!r);
  CHECK(r.err().code == code);
  CHECK(r.err().key == key);
  CHECK(r.err().file == mem.describe(file));
}

TEST_CASE("verify_any reports a missing piece of DCP's sharded files") {
  cairn::memory_storage mem;
  // Only rank 2's piece of w: rows 2 of [3, 4]; rows 0-1 are not covered.
  safetensors_reader_test::put_piece_file(mem, "shard-00002-model-00001-of-00001.safetensors",
                                          {{"w", {1, 4}}}, 8.0f,
                                          R"({"w": {"saved_offsets": [2, 0]}})");
  auto rep = cairn::verify_any(mem).value();
  CHECK(rep.format == "safetensors");
  CHECK(!rep.problems.empty());
}
