// stream::source and catalog_source (format/stream/source.hpp): a native and a safetensors
// checkpoint listed as tensors and read box by box, rows, batches; the errors of unknown keys,
// bad boxes, wrong buffers and corrupt bytes; objects read with their bytes.
#include "cairn/format/stream/source.hpp"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("catalog_source lists and reads a cairn checkpoint box by box") {
  cairn::memory_storage mem;
  cairn_test::save_source_sample(mem);
  auto src = cairn::stream::catalog_source::open(mem).value();
  CHECK(src->kind() == "cairn");
  cairn_test::check_reads(*src);
  cairn_test::check_request_errors(*src);
  CHECK(src->other_items() == std::vector<std::string>{"rng/shard_0_2", "rng/shard_1_2"});
  auto commons = src->commons().value();
  REQUIRE(commons.count("step") == 1);
  CHECK(commons.at("step").as<std::int64_t>() == 42);
}

TEST_CASE("catalog_source verifies what it reads: a flipped byte fails naming key and file") {
  cairn::memory_storage mem;
  cairn_test::save_source_sample(mem);
  auto src = cairn::stream::catalog_source::open(mem).value();
  const auto& c = src->metadata().tensors.at("w").chunks.front();
  const std::string file = src->metadata().files.at(c.where.file).name;
  std::vector<std::byte> data(mem.size(file).value());
  mem.read(file, 0, data).value();
  data[c.where.byte_offset] ^= std::byte{1};
  mem.put(file, data).value();
  std::vector<std::byte> out(c.region.volume() * 4);
  auto r = src->read_box("w", c.region, out);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().key == "w");
  CHECK(r.err().file.find(file) != std::string::npos);
}

TEST_CASE("catalog_source over metadata in memory reads objects with their bytes") {
  cairn::memory_storage mem;
  cairn_test::save_source_sample(mem);
  auto m = cairn::read_metadata(mem).value();
  auto src = cairn::stream::catalog_source::over(mem, m).value();
  CHECK(src->world_size() == 2);
  auto objects = src->objects().value();
  REQUIRE(objects.size() == 2);
  CHECK(objects.at("rng/shard_1_2").key == "rng");
  CHECK(objects.at("rng/shard_1_2").global_offset == cairn::shape{1});
  CHECK(objects.at("rng/shard_1_2").bytes == std::vector<std::byte>(4, std::byte{7}));
}

TEST_CASE("catalog_source over safetensors: no world size, no objects") {
  cairn::memory_storage st;
  std::vector<float> v{1.0f, 2.0f, 3.0f};
  cairn::safetensors::write_file(st, "model.safetensors",
                                 {{"v", cairn::dtype::f32, {3}, std::as_bytes(std::span(v))}})
      .value();
  auto src = cairn::stream::catalog_source::open(st).value();
  CHECK(src->kind() == "safetensors");
  CHECK(!src->world_size());
  CHECK(src->other_items().empty());
  std::vector<float> got(3);
  REQUIRE(src->read_box("v", cairn::box{{0}, {3}}, std::as_writable_bytes(std::span(got))));
  CHECK(got == v);
}
