// format/foreign.hpp: including it registers the PyTorch DCP and safetensors readers, so that
// read_any_metadata and load read those formats (and fail naming the file when they are bad).
#include "cairn/format/foreign.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/dcp/strategy.hpp"

namespace foreign_test {

/// model.safetensors holding "a" (f32 [2, 3], 0..5) and "b" (i64 [4], 10..13).
inline void put_safetensors(cairn::storage_ref st, std::string_view name = "model.safetensors") {
  std::vector<float> a(6);
  std::iota(a.begin(), a.end(), 0.0f);
  std::vector<std::int64_t> b{10, 11, 12, 13};
  cairn::safetensors::write_file(st, name,
                                 {{"a", cairn::dtype::f32, {2, 3}, std::as_bytes(std::span(a))},
                                  {"b", cairn::dtype::i64, {4}, std::as_bytes(std::span(b))}},
                                 {{"format", "pt"}})
      .value();
}

}  // namespace foreign_test

TEST_CASE("foreign.hpp registers the torch_dist and safetensors readers") {
  CHECK(cairn::detail::foreign_formats_registered);
  cairn::memory_storage mem;
  CHECK((cairn::detail::reader_of(mem, "torch_dist").value() == &cairn::dcp_as_metadata));
  CHECK((cairn::detail::reader_of(mem, "safetensors").value() == &cairn::safetensors_as_metadata));
  auto none = cairn::detail::reader_of(mem, "npz");
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::unsupported_version);
  CHECK(none.err().message.find("npz") != std::string::npos);
  CHECK(none.err().message.find("cairn/format/foreign.hpp") != std::string::npos);
  CHECK(none.err().file == mem.describe(""));
}

TEST_CASE("read_any_metadata and load read a safetensors file through the registered reader") {
  cairn::memory_storage mem;
  foreign_test::put_safetensors(mem);
  CHECK(cairn::detect_format(mem).value() == "safetensors");
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.format == "safetensors");
  CHECK(!m.verified());
  REQUIRE(m.tensors.size() == 2);
  CHECK(m.tensors.at("a").type == cairn::dtype::f32);
  CHECK(m.tensors.at("a").global_shape == cairn::shape{2, 3});
  CHECK(m.tensors.at("b").type == cairn::dtype::i64);
  CHECK(m.content_metadata.at("format") == "pt");

  // Load a column of "a" and all of "b" on one rank.
  std::vector<float> col(2, -1.0f);
  std::vector<std::int64_t> b(4, 0);
  cairn::state_dict sd;
  cairn::sharded_tensor<float> c;
  c.key = "a";
  c.type = cairn::dtype::f32;
  c.local_shape = {2, 1};
  c.global_shape = {2, 3};
  c.global_offset = {0, 2};
  c.data = std::span(col);
  sd.add("a", c);
  sd.add("b", cairn::from_rank_offsets("b", std::span(b), {4}, {}));
  cairn::single_communicator one;
  cairn::load(sd, mem, one);
  CHECK(col == std::vector<float>{2.0f, 5.0f});
  CHECK(b == std::vector<std::int64_t>{10, 11, 12, 13});
}

TEST_CASE("read_any_metadata reads a DCP checkpoint, and a bad .metadata fails naming it") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> rows(6, static_cast<float>(comm.rank() + 1));
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(rows), {2, 3}, {{0, comm.rank(), 2}}));
    cairn::save(sd, mem, comm, {.strategy = &td});
  });
  // Megatron's metadata.json sits beside .metadata: it says torch_dist, not cairn.
  CHECK(mem.exists("metadata.json").value());
  CHECK(cairn::detect_format(mem).value() == "torch_dist");
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.format == "torch_dist");
  REQUIRE(m.tensors.count("w") == 1);
  CHECK(m.tensors.at("w").global_shape == cairn::shape{4, 3});
  CHECK(m.tensors.at("w").chunks.size() == 2);

  SUBCASE("truncated") {
    std::vector<std::byte> head(std::min<std::uint64_t>(mem.size(".metadata").value(), 40));
    mem.read(".metadata", 0, head).value();
    mem.put(".metadata", head).value();
  }
  SUBCASE("not a pickle") {
    std::string junk = "this is not a pickle";
    mem.put(".metadata", std::as_bytes(std::span(junk))).value();
  }
  auto bad = cairn::read_any_metadata(mem);
  REQUIRE(!bad);
  CHECK(bad.err().code == cairn::errc::corrupt);
  CHECK(bad.err().file.find(".metadata") != std::string::npos);
}

TEST_CASE("a safetensors index takes precedence over model.safetensors") {
  cairn::memory_storage mem;
  foreign_test::put_safetensors(mem, "model-00001-of-00001.safetensors");
  // A stray model.safetensors with other tensors: the index decides what the checkpoint is.
  std::vector<float> other{9.0f};
  cairn::safetensors::write_file(
      mem, "model.safetensors",
      {{"stray", cairn::dtype::f32, {1}, std::as_bytes(std::span(other))}})
      .value();
  cairn::safetensors::index ix;
  ix.weight_map = {{"a", "model-00001-of-00001.safetensors"},
                   {"b", "model-00001-of-00001.safetensors"}};
  ix.total_size = 6 * 4 + 4 * 8;
  cairn::safetensors::write_index(mem, cairn::safetensors::index_name, ix).value();
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.tensors.count("a") == 1);
  CHECK(m.tensors.count("stray") == 0);
  REQUIRE(m.files.size() == 1);
  CHECK(m.files[0].name == "model-00001-of-00001.safetensors");
}
