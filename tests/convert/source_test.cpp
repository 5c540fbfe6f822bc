// The checkpoint sources unshard and convert read from (convert/source.hpp): a native, a DCP and
// a safetensors checkpoint listed as tensors and read box by box, rows, batches, and the errors
// of unknown keys, bad boxes, wrong buffers and corrupt bytes.
#include "cairn/convert/source.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/test_util.hpp"

namespace source_test {

using cairn::box;
using cairn::shape;

/// "w" f32 [6, 4] split by rows over 2 ranks, "ids" i64 [5] on rank 0, "step" common, "rng"
/// object per rank: saved with `strategy` (native when null).
inline void save_two_ranks(cairn::storage_ref st, const cairn::save_strategy* strategy = nullptr) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::byte> w(3 * 4 * 4), ids(5 * 8);
    cairn_test::fill_block("w", cairn::dtype::f32, {6, 4}, box{{3 * r, 0}, {3, 4}}, w.data());
    cairn_test::fill_block("ids", cairn::dtype::i64, {5}, box{{0}, {5}}, ids.data());
    cairn::state_dict sd;
    cairn::sharded_tensor<> tw;
    tw.key = "w";
    tw.type = cairn::dtype::f32;
    tw.local_shape = {3, 4};
    tw.global_shape = {6, 4};
    tw.global_offset = {3 * r, 0};
    tw.data = w;
    sd.add("w", tw);
    cairn::sharded_tensor<> ti;
    ti.key = "ids";
    ti.type = cairn::dtype::i64;
    ti.local_shape = {5};
    ti.global_shape = {5};
    ti.global_offset = {0};
    ti.replica_id = r;
    ti.data = ids;
    sd.add("ids", ti);
    sd.add("step", std::int64_t{42});
    sd.add("rng", cairn::per_rank("rng", std::vector<std::byte>(4, std::byte{7}), r, 2));
    cairn::save(sd, st, comm, {.strategy = strategy});
  });
}

/// The expected bytes of `region` of tensor `key` (`type`, `global`).
inline std::vector<std::byte> expected(const std::string& key,
                                       cairn::dtype type,
                                       const shape& global,
                                       const box& region) {
  std::vector<std::byte> out(static_cast<std::size_t>(region.volume()) * cairn::dtype_size(type));
  cairn_test::fill_block(key, type, global, region, out.data());
  return out;
}

/// Reads boxes of every kind from `src` and checks them against the saved values.
inline void check_reads(cairn::convert::source& src) {
  using cairn::dtype;
  REQUIRE(src.tensors().size() == 2);
  CHECK(src.tensors()[0].key == "ids");  // sorted by key
  CHECK(src.tensors()[1].key == "w");
  const auto* w = src.find("w");
  REQUIRE(w);
  CHECK(w->type == dtype::f32);
  CHECK(w->global_shape == shape{6, 4});
  CHECK(w->nbytes() == 96);
  CHECK(src.find("v") == nullptr);
  CHECK(src.find("w2") == nullptr);

  // A box across both ranks' rows, and two boxes of one tensor in one batch.
  box across{{2, 1}, {2, 2}};
  std::vector<std::byte> a(16), b(8), c(5 * 8);
  REQUIRE(src.read_box("w", across, a));
  CHECK(a == expected("w", dtype::f32, {6, 4}, across));
  box last{{5, 2}, {1, 2}};
  box all_ids{{0}, {5}};
  std::vector<std::byte> empty;
  REQUIRE(src.read({{"w", last, b}, {"ids", all_ids, c}, {"w", box{{0, 0}, {0, 4}}, empty}}));
  CHECK(b == expected("w", dtype::f32, {6, 4}, last));
  CHECK(c == expected("ids", dtype::i64, {5}, all_ids));
  std::vector<std::byte> rows(2 * 4 * 4);
  REQUIRE(src.read_rows("w", 4, 6, rows));
  CHECK(rows == expected("w", dtype::f32, {6, 4}, box{{4, 0}, {2, 4}}));
}

/// Every request error of `src`, by code and key.
inline void check_request_errors(cairn::convert::source& src) {
  std::vector<std::byte> buf(16);
  auto none = src.read_box("nope", box{{0}, {1}}, buf);
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);
  CHECK(none.err().key == "nope");
  CHECK(src.read_rows("nope", 0, 1, buf).err().code == cairn::errc::not_found);
  const std::int64_t big = std::int64_t{1} << 62;
  for (const box& bad :
       {box{{0}, {4, 1}}, box{{5, 0}, {2, 4}}, box{{-1, 0}, {1, 4}}, box{{0, 0}, {1, -4}},
        box{{big, 0}, {big + 1, 4}}, box{{0, 1}, {1, std::numeric_limits<std::int64_t>::max()}}}) {
    INFO(bad.str());
    auto r = src.read_box("w", bad, buf);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "w");
  }
  auto short_buf = src.read_box("w", box{{0, 0}, {1, 4}}, std::span(buf).first(15));
  REQUIRE(!short_buf);
  CHECK(short_buf.err().message.find("15 bytes") != std::string::npos);
  CHECK(!src.read_rows("w", 3, 2, buf));  // end before begin
}

}  // namespace source_test

TEST_CASE("native_source lists and reads a cairn checkpoint box by box") {
  cairn::memory_storage mem;
  source_test::save_two_ranks(mem);
  auto src = cairn::convert::native_source::open(mem).value();
  CHECK(src->kind() == "cairn");
  source_test::check_reads(*src);
  source_test::check_request_errors(*src);
  CHECK(src->other_items() == std::vector<std::string>{"rng/shard_0_2", "rng/shard_1_2"});
  auto commons = src->commons().value();
  REQUIRE(commons.count("step") == 1);
  CHECK(commons.at("step").as<std::int64_t>() == 42);
}

TEST_CASE("native_source verifies what it reads: a flipped byte fails naming key and file") {
  cairn::memory_storage mem;
  source_test::save_two_ranks(mem);
  auto src = cairn::convert::native_source::open(mem).value();
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

TEST_CASE("dcp_source reads a torch_dist checkpoint, its objects as other items") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  source_test::save_two_ranks(mem, &td);
  auto src = cairn::convert::dcp_source::open(mem).value();
  CHECK(src->kind() == "dcp");
  source_test::check_reads(*src);
  source_test::check_request_errors(*src);
  CHECK(src->other_items() == std::vector<std::string>{"rng/shard_0_2", "rng/shard_1_2"});
  // Megatron's common.pt, decoded as load decodes it, and the objects with their bytes.
  auto commons = src->commons().value();
  CHECK(commons.size() == 1);
  CHECK(commons.count("step") == 1);
  auto objects = src->objects().value();
  REQUIRE(objects.size() == 2);
  CHECK(objects.at("rng/shard_1_2").key == "rng");
  CHECK(objects.at("rng/shard_1_2").global_offset == cairn::shape{1});
  CHECK(!src->world_size());  // DCP does not record it
  CHECK(src->metadata().state_dict_metadata.count("w") == 1);
}

TEST_CASE("open_source picks the source of whatever format is there") {
  cairn::memory_storage empty;
  auto none = cairn::convert::open_source(empty);
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);  // an empty location
  CHECK(none.err().file == empty.describe(""));

  cairn::memory_storage native, dist, st;
  source_test::save_two_ranks(native);
  CHECK(cairn::convert::open_source(native).value()->kind() == "cairn");
  cairn::torch_dist_strategy td;
  source_test::save_two_ranks(dist, &td);
  CHECK(cairn::convert::open_source(dist).value()->kind() == "dcp");

  std::vector<float> v{1.0f, 2.0f, 3.0f};
  cairn::safetensors::write_file(st, "model.safetensors",
                                 {{"v", cairn::dtype::f32, {3}, std::as_bytes(std::span(v))}})
      .value();
  auto s = cairn::convert::open_source(st).value();
  CHECK(s->kind() == "safetensors");
  std::vector<float> got(2);
  REQUIRE(s->read_rows("v", 1, 3, std::as_writable_bytes(std::span(got))));
  CHECK(got == std::vector<float>{2.0f, 3.0f});
  auto wrong_size = s->read_rows("v", 0, 1, std::as_writable_bytes(std::span(got)));
  REQUIRE(!wrong_size);  // a buffer of 8 bytes for one element of 4
  CHECK(wrong_size.err().code == cairn::errc::invalid_argument);
}
