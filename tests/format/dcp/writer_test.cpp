// Writing a torch_dist checkpoint's pieces (format/dcp/writer.hpp): which dtypes each torch
// flavor holds, recording chunks and bytes items in DCP metadata, common values as Python values
// in common.pt, and the commit files in order with .metadata last.
#include "cairn/format/dcp/writer.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "cairn/format/dcp/reader.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/support/test_util.hpp"

namespace dcp_writer_test {

/// DCP metadata of a [4, 3] f32 tensor "w" in two row chunks, and a bytes item "obj".
inline cairn::dcp::metadata two_chunks() {
  cairn::dcp::metadata m;
  cairn::dcp::add_tensor_chunk(m, "w", cairn::dtype::f32, {4, 3}, cairn::box{{0, 0}, {2, 3}},
                               {"__0_0.distcp", 0, 100});
  cairn::dcp::add_tensor_chunk(m, "w", cairn::dtype::f32, {4, 3}, cairn::box{{2, 0}, {2, 3}},
                               {"__1_0.distcp", 64, 100});
  cairn::dcp::add_bytes_item(m, "obj", {"__0_0.distcp", 100, 30});
  return m;
}

}  // namespace dcp_writer_test

TEST_CASE("flavor_holds: torch 1.13 lacks the wide unsigned and float8 dtypes") {
  using cairn::dtype;
  namespace dcp = cairn::dcp;
  for (dtype t : {dtype::u16, dtype::u32, dtype::u64, dtype::f8_e4m3, dtype::f8_e5m2}) {
    INFO(cairn::dtype_name(t));
    CHECK(dcp::flavor_holds(dcp::flavor::torch2, t));
    CHECK(!dcp::flavor_holds(dcp::flavor::torch1_13, t));
    auto r = dcp::check_flavor_holds(dcp::flavor::torch1_13, t, "opt.step");
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "opt.step");
    CHECK(r.err().message.find(cairn::dtype_name(t)) != std::string::npos);
  }
  for (dtype t : {dtype::bool_, dtype::u8, dtype::i64, dtype::bf16, dtype::f16, dtype::f64})
    CHECK(dcp::check_flavor_holds(dcp::flavor::torch1_13, t, "k"));
}

TEST_CASE("add_tensor_chunk and add_bytes_item record items that encode and decode back") {
  auto m = dcp_writer_test::two_chunks();
  const auto& w = std::get<cairn::dcp::tensor_meta>(m.state_dict_metadata.at("w"));
  CHECK(w.type == cairn::dtype::f32);
  CHECK(w.size == cairn::shape{4, 3});
  REQUIRE(w.chunks.size() == 2);
  CHECK(w.chunks[1] == cairn::dcp::chunk{{2, 0}, {2, 3}});
  CHECK(std::holds_alternative<cairn::dcp::bytes_meta>(m.state_dict_metadata.at("obj")));
  REQUIRE(m.storage_data.size() == 3);
  CHECK(m.storage_data[1].first.hint == 1);  // the chunk's index among the tensor's chunks
  CHECK(m.storage_data[1].first.offset == cairn::shape{2, 0});
  CHECK(!m.storage_data[2].first.offset);  // a bytes item has no offsets

  auto back =
      cairn::dcp::decode(cairn::format_detail::as_bytes(cairn::dcp::encode(m).value())).value();
  const auto* second = back.find("w", cairn::shape{2, 0});
  REQUIRE(second);
  CHECK(second->relative_path == "__1_0.distcp");
  CHECK(second->offset == 64);
  CHECK(second->length == 100);
  const auto* obj = back.find("obj", std::nullopt);
  REQUIRE(obj);
  CHECK(obj->length == 30);

  // A chunk that overlaps another is refused when encoding, naming the tensor.
  cairn::dcp::add_tensor_chunk(m, "w", cairn::dtype::f32, {4, 3}, cairn::box{{1, 0}, {1, 3}},
                               {"__2_0.distcp", 0, 12});
  auto bad = cairn::dcp::encode(m);
  REQUIRE(!bad);
  CHECK(bad.err().key == "w");
}

TEST_CASE("common_to_pickle gives each common value its Python value") {
  using cairn::common_value;
  using K = cairn::pickle::value::kind;
  namespace dcp = cairn::dcp;
  auto i = dcp::common_to_pickle(common_value::of(std::int64_t{-5}));
  CHECK(i.type == K::integer);
  CHECK(i.i == -5);
  auto u = dcp::common_to_pickle(common_value::of(std::uint16_t{65535}));
  CHECK(u.i == 65535);
  auto b = dcp::common_to_pickle(common_value::of(true));
  CHECK(b.type == K::boolean);
  CHECK(b.i == 1);
  auto f = dcp::common_to_pickle(common_value::of(0.25f));
  CHECK(f.type == K::floating);
  CHECK(f.f == 0.25);
  auto s = dcp::common_to_pickle(common_value::of(std::string("run-β")));
  CHECK(s.type == K::string);
  CHECK(s.str == "run-β");
  auto v = dcp::common_to_pickle(common_value::of(std::vector<std::int32_t>{3, -4, 5}));
  REQUIRE(v.type == K::list);
  REQUIRE(v.elements().size() == 3);
  CHECK(v.elements()[1].i == -4);
  // A scalar whose bytes are not one element is None, never a read past the data.
  common_value torn = common_value::of(std::int64_t{1});
  torn.data.resize(3);
  CHECK(dcp::common_to_pickle(torn).is_none());
  // A vector with a trailing partial element drops it.
  common_value ragged = common_value::of(std::vector<std::int32_t>{1, 2});
  ragged.data.resize(6);
  CHECK(dcp::common_to_pickle(ragged).elements().size() == 1);
  // What the reader takes back is the value written (as Python's types: int -> i64).
  auto again = cairn::detail::common_from_pickle(i);
  REQUIRE(again);
  CHECK(again->as<std::int64_t>() == -5);
}

TEST_CASE("buffer_writer collects positioned writes, gaps zeroed") {
  cairn::dcp::detail::buffer_writer w;
  const std::byte x[] = {std::byte{1}, std::byte{2}};
  const std::byte y[] = {std::byte{9}};
  REQUIRE(w.write_at(4, x));
  REQUIRE(w.write_at(0, y));
  REQUIRE(w.write_at(5, y));  // overwrites
  REQUIRE(w.finish());
  CHECK(w.data() == cairn::bytes{std::byte{9}, std::byte{0}, std::byte{0}, std::byte{0},
                                 std::byte{1}, std::byte{9}});
}

TEST_CASE("write_commit_files writes common.pt and metadata.json, then .metadata last") {
  namespace dcp = cairn::dcp;
  auto m = dcp_writer_test::two_chunks();
  std::map<std::string, cairn::common_value> commons{
      {"step", cairn::common_value::of(std::int64_t{123})}, {"lr", cairn::common_value::of(0.5)}};
  cairn::memory_storage mem;
  auto names = dcp::write_commit_files(mem, m, dcp::flavor::torch2, commons).value();
  CHECK(names == std::vector<std::string>{"common.pt", "metadata.json", ".metadata"});
  CHECK(cairn_test::read_text(mem, "metadata.json") == dcp::megatron_metadata_json);
  auto back = dcp::read(mem).value();
  CHECK(back.storage_data.size() == 3);
  auto common = cairn::torch_zip::open_archive(mem, "common.pt").value();
  REQUIRE(common.root.is_dict());
  REQUIRE(common.root.get("step"));
  CHECK(common.root.get("step")->i == 123);
  CHECK(common.root.get("lr")->f == 0.5);

  // No common values: no common.pt. The flavor reaches .metadata (torch 1.13 module paths).
  cairn::memory_storage old;
  auto few = dcp::write_commit_files(old, m, dcp::flavor::torch1_13,
                                     std::map<std::string, cairn::common_value>{})
                 .value();
  CHECK(few == std::vector<std::string>{"metadata.json", ".metadata"});
  CHECK(!old.exists("common.pt").value());
  CHECK(cairn_test::read_text(old, ".metadata").find("_shard.checkpoint") != std::string::npos);
}

TEST_CASE("write_commit_files fails naming the file, and never writes .metadata after a failure") {
  namespace dcp = cairn::dcp;
  auto m = dcp_writer_test::two_chunks();
  std::map<std::string, cairn::common_value> commons{{"step", cairn::common_value::of(1)}};
  cairn::memory_storage mem;
  cairn::faulty_storage faulty{mem};
  SUBCASE("common.pt") {
    faulty.fail_op(0, cairn::fault_mode::fail);
    auto r = dcp::write_commit_files(faulty, m, dcp::flavor::torch2, commons);
    REQUIRE(!r);
    CHECK(r.err().file == "mem://common.pt");
  }
  SUBCASE("metadata.json") {
    faulty.fail_op(1, cairn::fault_mode::fail);
    auto r = dcp::write_commit_files(faulty, m, dcp::flavor::torch2, commons);
    REQUIRE(!r);
    CHECK(r.err().file == "mem://metadata.json");
  }
  SUBCASE("metadata that does not validate") {
    dcp::add_tensor_chunk(m, "w", cairn::dtype::f32, {4, 3}, cairn::box{{3, 0}, {2, 3}},
                          {"__2_0.distcp", 0, 24});  // runs past row 4
    auto r = dcp::write_commit_files(faulty, m, dcp::flavor::torch2, commons);
    REQUIRE(!r);
    CHECK(r.err().key == "w");
  }
  CHECK(!mem.exists(".metadata").value());

  // A lying disk on .metadata (the third operation, after the puts of common.pt and
  // metadata.json) is repaired by one more put: the commit is whole.
  cairn::memory_storage ok;
  cairn::faulty_storage liar{ok};
  liar.fail_op(2, cairn::fault_mode::lie_partial);
  REQUIRE(
      dcp::write_commit_files(liar, dcp_writer_test::two_chunks(), dcp::flavor::torch2, commons));
  CHECK(liar.fault_fired());
  CHECK(liar.fault_site().find(".metadata") != std::string::npos);
  CHECK(dcp::read(ok).value().storage_data.size() >= 3);
}
