// safetensors_as_metadata (format/safetensors/reader.hpp): one model.safetensors, or an index and
// the files it names, described as cairn metadata (one chunk per tensor at its byte offset), and
// the errors of missing files, tensors in two files and hostile headers.
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
    CHECK(r.err().code == cairn::errc::not_found);
    CHECK(r.err().file.find("model.safetensors") != std::string::npos);
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
