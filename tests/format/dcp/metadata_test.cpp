// dcp_metadata: parsing hand-built torch 2.x metadata (StorageMeta, transform_descriptors,
// Megatron's MCoreMetadata), writer round trips, and the save-time invariants.
#include "cairn/format/dcp/metadata.hpp"

#include <doctest/doctest.h>

#include "cairn/storage/memory.hpp"
#include "tests/format/samples/pickles.hpp"

namespace {
std::vector<std::byte> unhex(std::string_view h) {
  std::vector<std::byte> out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<std::byte>(nib(h[i]) * 16 + nib(h[i + 1])));
  return out;
}

void check_sample(const cairn::dcp::metadata& m) {
  REQUIRE(m.state_dict_metadata.size() == 2);
  const auto& t = std::get<cairn::dcp::tensor_meta>(m.state_dict_metadata.at("model.w"));
  CHECK(t.type == cairn::dtype::bf16);
  CHECK(t.size == cairn::shape{4, 6});
  REQUIRE(t.chunks.size() == 2);
  CHECK(t.chunks[1] == cairn::dcp::chunk{{2, 0}, {2, 6}});
  CHECK(std::holds_alternative<cairn::dcp::bytes_meta>(m.state_dict_metadata.at("step")));
  REQUIRE(m.storage_data.size() == 3);
  const auto* s = m.find("model.w", cairn::shape{2, 0});
  REQUIRE(s);
  CHECK(s->relative_path == "__1_0.distcp");
  CHECK(s->offset == 64);
  CHECK(s->length == 1000);
  const auto* b = m.find("step", std::nullopt);
  REQUIRE(b);
  CHECK(b->offset == 1000);
  CHECK(m.planner_data.at("model.w").size() == 2);
  CHECK(m.planner_data.at("model.w")[1].str == "w");
}
}  // namespace

TEST_CASE("parses torch 2.x metadata built by CPython with StorageMeta and extras") {
  auto bytes = unhex(cairn_samples::dcp2x_plain);
  auto m = cairn::dcp::decode(bytes, ".metadata").value();
  CHECK(m.class_name == "Metadata");
  CHECK(m.class_module == "torch.distributed.checkpoint.metadata");
  check_sample(m);
  CHECK(m.version == "1.0.0");
  REQUIRE(m.extras.count("storage_meta"));
  CHECK(m.extras.at("storage_meta").is_object());
}

TEST_CASE("parses Megatron's MCoreMetadata subclass and keeps mcore_data") {
  auto bytes = unhex(cairn_samples::dcp2x_mcore);
  auto m = cairn::dcp::decode(bytes, ".metadata").value();
  CHECK(m.class_name == "MCoreMetadata");
  check_sample(m);
  REQUIRE(m.extras.count("mcore_data"));
  CHECK(m.extras.at("mcore_data").get("model.w") != nullptr);
}

TEST_CASE("writer output parses back, in both module flavors, deterministically") {
  cairn::dcp::metadata m;
  m.state_dict_metadata["w"] =
      cairn::dcp::tensor_meta{cairn::dtype::f32, {4, 2}, {{{0, 0}, {2, 2}}, {{2, 0}, {2, 2}}}};
  m.state_dict_metadata["extra"] = cairn::dcp::bytes_meta{};
  m.planner_data["w"] = {cairn::pickle::value::string("w")};
  m.storage_data.push_back({{"w", cairn::shape{0, 0}, 0}, {"__0_0.distcp", 0, 700}});
  m.storage_data.push_back({{"w", cairn::shape{2, 0}, 1}, {"__1_0.distcp", 0, 700}});
  m.storage_data.push_back({{"extra", std::nullopt, std::nullopt}, {"__0_0.distcp", 700, 50}});
  m.version = "1.0.0";
  for (auto f : {cairn::dcp::flavor::torch2, cairn::dcp::flavor::torch1_13}) {
    cairn::memory_storage st;
    cairn::dcp::write(st, m, f).value();
    auto back = cairn::dcp::read(st).value();
    CHECK(back.state_dict_metadata.size() == 2);
    CHECK(std::get<cairn::dcp::tensor_meta>(back.state_dict_metadata.at("w")).chunks[1].offsets ==
          cairn::shape{2, 0});
    CHECK(back.find("extra", std::nullopt)->offset == 700);
    CHECK(back.find("w", cairn::shape{2, 0})->relative_path == "__1_0.distcp");
    CHECK(back.version == "1.0.0");
    CHECK(cairn::dcp::encode(back, f).value() == cairn::dcp::encode(m, f).value());
  }
}

TEST_CASE("save-time invariants: inside, no overlap, full cover") {
  cairn::dcp::metadata m;
  auto& t = m.state_dict_metadata["w"] = cairn::dcp::tensor_meta{cairn::dtype::f32, {4}, {}};
  auto chunks = [&](std::vector<cairn::dcp::chunk> cs) {
    std::get<cairn::dcp::tensor_meta>(t).chunks = std::move(cs);
    return cairn::dcp::validate(m);
  };
  CHECK(chunks({{{0}, {2}}, {{2}, {2}}}));
  auto r = chunks({{{0}, {2}}, {{3}, {2}}});
  CHECK(r.err().message.find("outside") != std::string::npos);
  r = chunks({{{0}, {3}}, {{1}, {1}}});
  CHECK(r.err().message.find("overlap") != std::string::npos);
  CHECK(r.err().key == "w");
  r = chunks({{{0}, {2}}});
  CHECK(r.err().message.find("cover") != std::string::npos);
  CHECK(
      !cairn::dcp::decode(
           cairn::format_detail::as_bytes(cairn::pickle::dumps(cairn::pickle::value::list())), "m")
           .has_value());
}

TEST_CASE("shapes that overflow are rejected by validate and by the reader") {
  const std::int64_t e62 = std::int64_t{1} << 62;
  cairn::dcp::metadata m;
  m.state_dict_metadata["w"] = cairn::dcp::tensor_meta{cairn::dtype::u8, {e62}, {{{e62}, {e62}}}};
  CHECK(cairn::dcp::validate(m).err().code == cairn::errc::integrity);
  m.state_dict_metadata["w"] = cairn::dcp::tensor_meta{cairn::dtype::f32, {e62}, {{{0}, {e62}}}};
  CHECK(!cairn::dcp::validate(m));
  // Written without validation (to_value), read back: the reader refuses it.
  std::string bytes = cairn::pickle::dumps(cairn::dcp::to_value(m), 4);
  auto r = cairn::dcp::decode(cairn::format_detail::as_bytes(bytes), ".metadata");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().key == "w");
  // A chunk of another rank than its tensor.
  m.state_dict_metadata["w"] = cairn::dcp::tensor_meta{cairn::dtype::f32, {4}, {{{0, 0}, {4, 1}}}};
  bytes = cairn::pickle::dumps(cairn::dcp::to_value(m), 4);
  CHECK(!cairn::dcp::decode(cairn::format_detail::as_bytes(bytes), ".metadata"));
}
