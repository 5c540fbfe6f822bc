// safetensors: layout, streaming writes, validation of corrupt headers, index files.
#include "cairn/format/safetensors/file.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"

namespace st = cairn::safetensors;

namespace {
template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

std::vector<std::byte> whole(cairn::memory_storage& m, std::string_view name) {
  auto n = m.size(name).value();
  std::vector<std::byte> b(n);
  m.read(name, 0, b).value();
  return b;
}

// A file with the given header JSON (unpadded) and `data_bytes` zero bytes of data.
void put_raw(cairn::memory_storage& m, std::string_view name, std::string json, std::size_t data) {
  std::string f;
  cairn::format_detail::put_le(f, json.size(), 8);
  f += json;
  f.append(data, '\0');
  m.put(name, cairn::format_detail::as_bytes(f)).value();
}
}  // namespace

TEST_CASE("header layout matches the reference writer: metadata first, dtype then name") {
  cairn::memory_storage m;
  std::vector<float> b{1.f, 2.f};
  std::vector<std::int64_t> a{7};
  std::vector<std::uint8_t> c{1, 2, 3};
  st::write_file(m, "x.safetensors",
                 {{"b", cairn::dtype::f32, {2}, bytes_of(b)},
                  {"c", cairn::dtype::u8, {3}, bytes_of(c)},
                  {"a", cairn::dtype::i64, {1}, bytes_of(a)}},
                 {{"format", "pt"}})
      .value();
  auto f = whole(m, "x.safetensors");
  std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("c":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  REQUIRE(f.size() == 8 + json.size() + 19);
  CHECK(cairn::format_detail::load_le(f.data(), 8) == json.size());
  CHECK(std::string(reinterpret_cast<const char*>(f.data()) + 8, json.size()) == json);
  CHECK((8 + json.size()) % 8 == 0);

  auto h = st::read_header(m, "x.safetensors").value();
  CHECK(h.metadata.at("format") == "pt");
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.tensors[0].name == "a");
  std::vector<float> back(2);
  st::read_tensor(m, "x.safetensors", h, "b", std::as_writable_bytes(std::span(back))).value();
  CHECK(back == b);
  std::uint8_t mid = 0;
  st::read_range(m, "x.safetensors", h, "c", 1, std::as_writable_bytes(std::span(&mid, 1))).value();
  CHECK(mid == 2);
}

TEST_CASE("streaming writer: pieces in any order, deterministic output, completeness check") {
  std::vector<double> big(1000);
  std::iota(big.begin(), big.end(), 0.5);
  std::vector<cairn::bf16> h16{cairn::bf16(1.f), cairn::bf16(-2.f)};
  auto run = [&](cairn::memory_storage& m, bool reverse) {
    auto w = st::writer::open(m, "s.safetensors",
                              {{"w", cairn::dtype::f64, {10, 100}},
                               {"h", cairn::dtype::bf16, {2}},
                               {"scalar", cairn::dtype::i32, {}},
                               {"empty", cairn::dtype::f32, {0, 4}}})
                 .value();
    auto raw = bytes_of(big);
    std::vector<std::size_t> order{0, 1, 2, 3};
    if (reverse) std::reverse(order.begin(), order.end());
    for (auto i : order) w.write_at("w", i * 2000, raw.subspan(i * 2000, 2000)).value();
    w.write("h", bytes_of(h16)).value();
    std::int32_t s = -5;
    w.write("scalar", std::as_bytes(std::span(&s, 1))).value();
    w.write("empty", {}).value();
    w.finish().value();
  };
  cairn::memory_storage m1, m2;
  run(m1, false);
  run(m2, true);
  CHECK(whole(m1, "s.safetensors") == whole(m2, "s.safetensors"));
  auto h = st::read_header(m1, "s.safetensors").value();
  for (const auto& t : h.tensors)
    CHECK(t.file_offset() % cairn::dtype_size(t.type) == 0);  // aligned for mmap
  CHECK(h.find("scalar")->dims.empty());
  CHECK(h.find("empty")->nbytes() == 0);
  std::vector<double> part(3);
  st::read_range(m1, "s.safetensors", h, "w", 8 * 500, std::as_writable_bytes(std::span(part)))
      .value();
  CHECK(part[0] == 500.5);
  CHECK(part[2] == 502.5);

  cairn::memory_storage m3;
  auto w = st::writer::open(m3, "t", {{"a", cairn::dtype::f32, {4}}}).value();
  std::vector<float> two{1, 2};
  w.write_at("a", 0, bytes_of(two)).value();
  auto r = w.finish();
  REQUIRE(!r);
  CHECK(r.err().key == "a");
  CHECK(!w.write_at("a", 12, bytes_of(two)));  // past the end
  CHECK(w.write_at("nope", 0, {}).err().code == cairn::errc::not_found);
  CHECK(!st::plan({{"a", cairn::dtype::f32, {1}}, {"a", cairn::dtype::i8, {1}}}));
}

TEST_CASE("reader rejects corrupt headers with file, key and offset") {
  cairn::memory_storage m;
  auto expect_corrupt = [&](std::string json, std::size_t data, std::string key,
                            std::string fragment) {
    put_raw(m, "bad", json, data);
    auto r = st::read_header(m, "bad");
    REQUIRE_MESSAGE(!r, json);
    CHECK(r.err().code == cairn::errc::corrupt);
    CHECK(r.err().file.find("bad") != std::string::npos);
    CHECK(r.err().key == key);
    CHECK(r.err().offset.has_value());
    CHECK_MESSAGE(r.err().message.find(fragment) != std::string::npos, r.err().describe());
  };
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                 16, "b", "gap");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12, "b", "overlaps");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "a",
                 "dtype x shape");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9, "", "ends at");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                 8, "a", "duplicate");
  expect_corrupt(R"({"__metadata__":{"x":1}})", 0, "x", "not a string");
  expect_corrupt(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1, "a", "F4");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0, "a", "shape");
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 0, "a", "end");
  expect_corrupt(R"({"a":{"dtype":"F32")", 0, "", "malformed");
  expect_corrupt(R"( {})", 0, "", "start");

  std::string f;
  cairn::format_detail::put_le(f, 200'000'000, 8);
  m.put("huge", cairn::format_detail::as_bytes(f)).value();
  auto r = st::read_header(m, "huge");
  REQUIRE(!r);
  CHECK(r.err().offset == 0u);
  cairn::format_detail::put_le(f, 0, 0);
  m.put("short", cairn::format_detail::as_bytes(std::string("abc"))).value();
  CHECK(st::read_header(m, "short").err().code == cairn::errc::corrupt);
  put_raw(m, "trunc", "{}", 0);
  m.put("trunc", cairn::format_detail::as_bytes(std::string("\x40\0\0\0\0\0\0\0{}", 10))).value();
  CHECK(st::read_header(m, "trunc").err().message.find("past the end") != std::string::npos);
}

TEST_CASE("model.safetensors.index.json round-trips and matches transformers' formatting") {
  st::index ix;
  ix.total_size = 123;
  ix.weight_map = {{"b.weight", "model-00002-of-00002.safetensors"},
                   {"a.weight", "model-00001-of-00002.safetensors"}};
  std::string json = st::to_json(ix);
  CHECK(json ==
        "{\n  \"metadata\": {\n    \"total_size\": 123\n  },\n  \"weight_map\": {\n"
        "    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
        "    \"b.weight\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  cairn::memory_storage m;
  st::write_index(m, st::index_name, ix).value();
  auto back = st::read_index(m, st::index_name).value();
  CHECK(back.total_size == 123);
  CHECK(back.weight_map == ix.weight_map);
  auto bad = st::index_from_json("{\"metadata\":{}}", "idx.json");
  REQUIRE(!bad);
  CHECK(bad.err().file == "idx.json");
}

TEST_CASE("an index whose total_size does not fit 64 bits is corrupt") {
  CHECK(!st::index_from_json(R"({"metadata":{"total_size":1e300},"weight_map":{}})", "i"));
  CHECK(!st::index_from_json(R"({"metadata":{"total_size":-1},"weight_map":{}})", "i"));
  CHECK(st::index_from_json(R"({"metadata":{"total_size":1e3},"weight_map":{}})", "i")
            .value()
            .total_size == 1000);
}

TEST_CASE("a streaming write killed before finish() leaves no valid header over holes") {
  // file_storage writes in place: the data lands first, the header only at finish().
  std::string root = (std::filesystem::temp_directory_path() / "cairn-st-XXXXXX").string();
  REQUIRE(::mkdtemp(root.data()));
  {
    cairn::file_storage disk(root);
    std::vector<float> a(64, 1.0f), b(64, 2.0f);
    auto w = st::writer::open(disk, "m.safetensors",
                              {{"a", cairn::dtype::f32, {64}}, {"b", cairn::dtype::f32, {64}}})
                 .value();
    // Only the second tensor arrives, as after a kill mid-way through parallel writes: the file
    // reaches its full length with the first tensor's bytes still a hole of zeros.
    w.write("b", std::as_bytes(std::span(b))).value();
    auto h = st::read_header(disk, "m.safetensors");
    REQUIRE(!h);
    CHECK(h.err().code == cairn::errc::corrupt);
  }
  std::filesystem::remove_all(root);
}
