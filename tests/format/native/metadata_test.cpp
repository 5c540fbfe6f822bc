// metadata.json encoding and decoding.
#include "cairn/format/native/metadata.hpp"

#include <doctest/doctest.h>

TEST_CASE("metadata round-trips through JSON, escaping keys") {
  cairn::checkpoint_metadata m;
  m.world_size = 3;
  m.save_id = "abc";
  m.block_size = 64;
  m.files.push_back({"data.0.abc.cairn", 0, 208});
  m.content_metadata = {{"quote\"key", "line\nbreak"}};
  cairn::tensor_record t;
  t.type = cairn::dtype::bf16;
  t.global_shape = {2, 50};
  t.chunks.push_back({cairn::box{{0, 0}, {2, 50}}, cairn::extent{0, 0, 200, {1, 2, 3, 4}}});
  m.tensors["weird \\ key/é"] = t;
  m.objects["rng/shard_0_1"] = cairn::object_record{"rng", {1}, {0}, cairn::extent{0, 200, 0, {}}};
  m.common = cairn::extent{0, 200, 8, {0xffffffffffffffffull}};
  m.commons["step"] = cairn::common_record{cairn::common_kind::scalar, cairn::dtype::i64, 0, 8};
  std::string json = cairn::to_json(m);
  auto back = cairn::metadata_from_json(json, "x").value();
  CHECK(back.world_size == 3);
  CHECK(back.content_metadata == m.content_metadata);
  CHECK(back.tensors.at("weird \\ key/é").chunks[0].where.checksums ==
        std::vector<std::uint64_t>{1, 2, 3, 4});
  CHECK(back.common->checksums[0] == 0xffffffffffffffffull);
  CHECK(back.commons.at("step").type == cairn::dtype::i64);
  CHECK(cairn::to_json(back) == json);
}

TEST_CASE("malformed metadata is a corrupt error naming the file") {
  auto r = cairn::metadata_from_json("{\"format\":\"cairn\",\"version\":1", "ckpt/metadata.json");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().file == "ckpt/metadata.json");
  auto v = cairn::metadata_from_json("{\"format\":\"cairn\",\"version\":99}", "m");
  REQUIRE(!v);
  CHECK(v.err().code == cairn::errc::unsupported_version);
}
