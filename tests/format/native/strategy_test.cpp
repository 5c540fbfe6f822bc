// native_strategy (format/native/strategy.hpp) with zstd: compressed blocks, tiled or not, load on
// another topology and verify; a corrupt block names key and offset; levels out of range.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/message_check.hpp"
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

TEST_CASE("zstd: compressed blocks, tiled or not, load on another topology and verify") {
  for (int variant = 0; variant < 4; ++variant) {
    const bool tile = variant % 2 == 0, index_files = variant < 2;
    INFO("tile " << tile << " index_files " << index_files);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.zstd_level = 3;
    so.block_size = 16 << 10;
    so.tile = tile;
    so.index_files = index_files;
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> buf;
      cairn::state_dict sd;
      sd.add("c", counters(buf, 256, comm.rank(), 4));
      sd.add("step", std::int64_t{5});
      cairn::save(sd, mem, comm, so);
    });
    auto m = cairn::read_metadata(mem).value();
    CHECK(m.version == (index_files ? 5 : 3));
    const auto& t = m.tensors.at("counters");
    CHECK(t.stored_bytes() * 4 < t.chunk_bytes());  // i64 counters below 97 shrink a lot
    std::uint64_t files = 0;
    for (const auto& f : m.files)
      if (f.name.starts_with("data.")) files += mem.size(f.name).value();
    CHECK(files * 4 < t.nbytes());
    CHECK(cairn::verify_checkpoint(mem).value().empty());
    // Load on 3 ranks; a counting storage shows only the needed blocks are read.
    data_read_counter counting(mem);
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> want;
      auto w = counters(want, 256, comm.rank(), 3);
      std::vector<std::int64_t> got(want.size(), -1);
      auto g = w;
      g.data = got;
      cairn::state_dict sd;
      sd.add("c", g);
      cairn::load(sd, counting, comm);
      CHECK(got == want);
    });
    // Each stored block is read about once (blocks on a rank boundary by both ranks).
    CHECK(counting.data_bytes_read() < files + files / 4);
    // Load one row: reads a block or two, not the tensor.
    counting.data_bytes = 0;
    {
      std::vector<std::int64_t> row(256, -1);
      cairn::sharded_tensor<std::int64_t> r1;
      r1.key = "counters";
      r1.type = cairn::dtype::i64;
      r1.local_shape = {1, 256};
      r1.global_shape = {256, 256};
      r1.global_offset = {100, 0};
      r1.data = row;
      cairn::state_dict sd;
      sd.add("c", r1);
      cairn::single_communicator one;
      cairn::load(sd, counting, one);
      for (int i = 0; i < 256; ++i) CHECK(row[static_cast<std::size_t>(i)] == (100 * 256 + i) % 97);
      CHECK(counting.data_bytes_read() < t.stored_bytes() / 8);
    }
  }
}

TEST_CASE("zstd: a corrupted compressed block fails load and verify naming key and offset") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.zstd_level = 1;
  so.block_size = 8 << 10;
  std::vector<std::int64_t> buf;
  cairn::state_dict sd;
  sd.add("c", counters(buf, 64, 0, 1));
  cairn::single_communicator one;
  cairn::save(sd, mem, one, so);
  auto m = cairn::read_metadata(mem).value();
  const auto& c = m.tensors.at("counters").chunks.at(1);
  REQUIRE(c.where.compressed());
  REQUIRE(c.where.block_stored[0] < so.block_size);
  const std::string& file = m.files.at(c.where.file).name;
  std::uint64_t at = c.where.block_offsets[0] + c.where.block_stored[0] / 2;
  std::vector<std::byte> all(mem.size(file).value());
  mem.read(file, 0, all).value();
  all[at] ^= std::byte{0x5a};
  mem.put(file, all).value();
  auto problems = cairn::verify_checkpoint(mem).value();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].err.key == "counters");
  CHECK(problems[0].err.code == cairn::errc::corrupt);
  CHECK(problems[0].err.offset == c.where.block_offsets[0]);
  std::vector<std::int64_t> back(buf.size());
  auto t = counters(buf, 64, 0, 1);
  t.data = back;
  cairn::state_dict target;
  target.add("c", t);
  auto r = cairn::try_load(target, mem, one);
  REQUIRE(!r);
  CHECK(r.err().key == "counters");
  CHECK(r.err().code == cairn::errc::corrupt);
}

TEST_CASE("zstd_level out of range is refused before anything is written") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.zstd_level = 99;
  std::vector<std::int64_t> buf;
  cairn::state_dict sd;
  sd.add("c", counters(buf, 4, 0, 1));
  cairn::single_communicator one;
  auto r = cairn::try_save(sd, mem, one, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(mem.list("").value().empty());
}

TEST_CASE("the native strategy's reports round-trip and refuse truncation") {
  cairn::detail::index_part_message part;
  part.bytes_of_rank = 4096;
  part.slots.emplace_back(cairn::detail::part_object{"rng@0", "rng", {2}, {1}, 0, 16});
  part.slots.emplace_back(cairn::detail::part_chunk{
      "w", cairn::dtype::bf16, {8, 8}, cairn::box{{0, 0}, {4, 8}}, {1, 2}, 16, 64});
  cairn_test::check_message(part);
  cairn::detail::native_write_report write;
  write.part = part;
  write.compressed = true;
  write.file_size = 80;
  write.items.push_back({{1, 2}, cairn::detail::compressed_placement{16, {16, 40}, {24, 40}}});
  write.items.push_back({{3}, std::nullopt});
  cairn_test::check_message(write);
  cairn::detail::native_index_report index;
  index.writes = true;
  index.data_size = 80;
  index.objects.push_back({"rng@0", "rng", {2}, {1}, cairn::extent{0, 0, 16, {9}}});
  index.index =
      cairn::detail::reported_index_file{512, 77, {{"w", cairn::dtype::f32, {8, 8}, 0, 256, 5, 2}}};
  cairn_test::check_message(index);
  cairn_test::check_message(cairn::detail::routed_sections{{cairn::bytes(5), cairn::bytes(1)}});
}

TEST_CASE("a write report with the wrong number of items is refused naming the rank") {
  cairn::save_index index;
  index.world_size = 1;
  index.block_size = 64;
  index.slots.resize(1);
  index.bytes_of_rank = {0};
  index.slots[0].push_back(cairn::write_slot{});
  index.slots[0][0].is_object = true;
  index.slots[0][0].key = "rng";
  index.objects["rng"] = cairn::object_record{"rng", {1}, {0}, cairn::extent{0, 0, 8, {}}};
  const cairn::bytes empty = cairn::detail::encode_message(cairn::detail::native_write_report{});
  try {
    (void)cairn::native_strategy::metadata_of(index, "id", {empty});
    FAIL_CHECK("no exception");
  } catch (const cairn::exception& e) {
    CHECK(e.err().code == cairn::errc::comm);
    CHECK(e.err().message.find("0 items for 1 planned") != std::string::npos);
    CHECK(e.err().rank == 0);
  }
}
