// The phases of a load (pipeline/load.hpp) below load(): metadata read once and shared, records
// matched to targets, objects found on a changed grid, strict keys across ranks, verified reads,
// and every rank agreeing on the lowest failing rank's error (shared pieces: share_test.cpp).
#include "cairn/pipeline/load.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/leaf.hpp"
#include "tests/support/message_check.hpp"
#include "tests/support/test_util.hpp"

namespace pipeline_load_test {

/// A checkpoint of "w" (f32 [4, 3], 0..11), "b" (f32 [40000], replicated), "step" (common) and
/// "rng" (an object per rank of 2), saved on 2 ranks with 16-byte checksum blocks.
inline void save_sample(cairn::storage_ref st) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> w(6), b(40000);
    for (int i = 0; i < 6; ++i) w[i] = static_cast<float>(6 * r + i);
    for (int i = 0; i < 40000; ++i) b[i] = static_cast<float>(i % 1000);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {{0, r, 2}}));
    sd.add("b", cairn::from_rank_offsets("b", std::span(b), {40000}, {}, r));
    sd.add("step", std::int64_t{5});
    sd.add("rng", cairn::per_rank("rng", std::vector<std::byte>(3, std::byte(r + 1)), r, 2));
    cairn::save(sd, st, comm, {.block_size = 16});
  });
}

}  // namespace pipeline_load_test

TEST_CASE("read_metadata_collective: every rank gets rank 0's metadata, or its error") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    auto m = cairn::detail::read_metadata_collective(mem, comm).value();
    CHECK(m.world_size == 2);
    CHECK(m.tensors.at("w").global_shape == cairn::shape{4, 3});
    CHECK(cairn::detail::checkpoint_keys(m) == std::set<std::string>{"b", "rng", "step", "w"});
  });
  cairn::memory_storage empty;
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    auto m = cairn::detail::read_metadata_collective(empty, comm);
    REQUIRE(!m);
    CHECK(m.err().code == cairn::errc::not_found);
  });
}

TEST_CASE("matching_record checks dtype and shape, zeroing a padded target") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  auto m = cairn::read_metadata(mem).value();
  std::vector<float> buf(12, 7.0f);
  auto t = cairn_test::f32_leaf("w", buf, {4, 3}, cairn::box{{0, 0}, {4, 3}});
  CHECK(cairn::detail::matching_record(t, m).value() == &m.tensors.at("w"));

  auto missing = t;
  missing.sharding.key = "v";
  CHECK(cairn::detail::matching_record(missing, m).err().code == cairn::errc::not_found);

  auto wrong_type = t;
  wrong_type.sharding.type = cairn::dtype::i32;
  auto r = cairn::detail::matching_record(wrong_type, m);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::mismatch);
  CHECK(r.err().key == "w");
  CHECK(r.err().message.find("F32") != std::string::npos);
  CHECK(r.err().message.find("I32") != std::string::npos);

  std::vector<float> wide(4 * 5, 7.0f);
  auto padded = cairn_test::f32_leaf("w", wide, {4, 5}, cairn::box{{0, 0}, {4, 5}});
  auto s = cairn::detail::matching_record(padded, m);
  REQUIRE(!s);
  CHECK(s.err().code == cairn::errc::mismatch);
  CHECK(wide[0] == 7.0f);  // refused before touching the target
  padded.sharding.allow_shape_mismatch = true;
  REQUIRE(cairn::detail::matching_record(padded, m));
  CHECK(std::all_of(wide.begin(), wide.end(), [](float x) { return x == 0.0f; }));

  auto torn = t;
  torn.nbytes -= 2;
  CHECK(cairn::detail::matching_record(torn, m).err().code == cairn::errc::invalid_argument);
}

TEST_CASE("find_saved_object: the same grid, or a changed one through object_mapping") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  auto m = cairn::read_metadata(mem).value();
  cairn::object_leaf o;
  o.key = "rng";
  o.global_shape = {2};
  o.global_offset = {1};
  cairn::load_options opt;
  CHECK(cairn::detail::find_saved_object(o, m, opt).value() == &m.objects.at("rng/shard_1_2"));

  o.global_shape = {4};
  o.global_offset = {3};
  auto changed = cairn::detail::find_saved_object(o, m, opt);
  REQUIRE(!changed);
  CHECK(changed.err().code == cairn::errc::mismatch);
  CHECK(changed.err().key == "rng");
  CHECK(changed.err().message.find("world size 2") != std::string::npos);

  opt.object_mapping = cairn::objects_modulo();
  CHECK(cairn::detail::find_saved_object(o, m, opt).value() == &m.objects.at("rng/shard_1_2"));
  opt.object_mapping = [](const std::string&, const cairn::shape&, const cairn::shape&,
                          const cairn::shape&) { return std::optional<cairn::shape>(); };
  CHECK(cairn::detail::find_saved_object(o, m, opt).value() == nullptr);
  opt.object_mapping = [](const std::string&, const cairn::shape&, const cairn::shape&,
                          const cairn::shape&) {
    return std::optional<cairn::shape>(cairn::shape{7});
  };
  auto nowhere = cairn::detail::find_saved_object(o, m, opt);
  REQUIRE(!nowhere);
  CHECK(nowhere.err().code == cairn::errc::not_found);
  CHECK(nowhere.err().message.find("rng/shard_7_2") != std::string::npos);

  o.key = "other";
  CHECK(cairn::detail::find_saved_object(o, m, opt).err().code == cairn::errc::not_found);
}

TEST_CASE("load_leaves_local reads verified blocks, leaves skipped pieces alone") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  auto m = cairn::read_metadata(mem).value();
  std::vector<float> col(4, -1.0f), row(3, -1.0f);
  cairn::leaf_list leaves;
  leaves.tensors.push_back(cairn_test::f32_leaf("w", col, {4, 3}, cairn::box{{0, 1}, {4, 1}}));
  leaves.tensors.push_back(cairn_test::f32_leaf("w", row, {4, 3}, cairn::box{{2, 0}, {1, 3}}));
  cairn::load_stats stats;
  REQUIRE(cairn::detail::load_leaves_local(leaves, mem, m, {}, stats, {{1, 0}}));
  CHECK(col == std::vector<float>{1, 4, 7, 10});
  CHECK(row == std::vector<float>{-1, -1, -1});  // skipped: another rank broadcasts it
  CHECK(stats.bytes_needed == 16);
  CHECK(stats.bytes_read >= 16);

  // A common value the checkpoint lacks fails naming its path.
  cairn::state_dict sd;
  sd.add("epoch", std::int64_t{0});
  auto commons = cairn::flatten(sd);
  auto missing = cairn::detail::load_leaves_local(commons, mem, m, {}, stats);
  REQUIRE(!missing);
  CHECK(missing.err().code == cairn::errc::not_found);
  CHECK(missing.err().key == "epoch");

  // A flipped byte in the data fails the block's checksum, naming key and file.
  const auto& c = m.tensors.at("w").chunks.front();
  const std::string file = m.files.at(c.where.file).name;
  std::vector<std::byte> bytes(mem.size(file).value());
  mem.read(file, 0, bytes).value();
  bytes[c.where.byte_offset + 1] ^= std::byte{0x40};
  mem.put(file, bytes).value();
  std::vector<float> all(12);
  cairn::leaf_list whole;
  whole.tensors.push_back(cairn_test::f32_leaf("w", all, {4, 3}, cairn::box{{0, 0}, {4, 3}}));
  auto bad = cairn::detail::load_leaves_local(whole, mem, m, {}, stats);
  REQUIRE(!bad);
  CHECK(bad.err().code == cairn::errc::corrupt);
  CHECK(bad.err().key == "w");
  CHECK(bad.err().file.find(file) != std::string::npos);
  CHECK(bad.err().offset.has_value());
}

TEST_CASE("apply_strict finds missing keys across ranks and drops unexpected ones") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  auto m = cairn::read_metadata(mem).value();
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> a(12), b(40000);
    cairn::leaf_list leaves;
    if (comm.rank() == 0)
      leaves.tensors.push_back(cairn_test::f32_leaf("w", a, {4, 3}, {{0, 0}, {4, 3}}));
    else
      leaves.tensors.push_back(cairn_test::f32_leaf("zzz", b, {40000}, {{0}, {40000}}));
    cairn::load_stats stats;
    cairn::load_options opt{.strict = cairn::strict_mode::return_all};
    REQUIRE(cairn::detail::apply_strict(leaves, m, comm, opt, stats));
    // Nobody asked for b, rng or step; w was asked for by rank 0 only, which is enough.
    CHECK(stats.missing == std::vector<std::string>{"b", "rng", "step"});
    CHECK(leaves.tensors.size() == (comm.rank() == 0 ? 1u : 0u));
    CHECK(stats.unexpected ==
          (comm.rank() == 0 ? std::vector<std::string>{} : std::vector<std::string>{"zzz"}));
    opt.strict = cairn::strict_mode::raise_all;
    auto r = cairn::detail::apply_strict(leaves, m, comm, opt, stats);
    REQUIRE(!r);
    CHECK(r.err().key == "b");
  });
}

TEST_CASE("agree_on_load gives every rank the lowest failing rank's error") {
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    std::optional<cairn::error> f;
    if (comm.rank() >= 2)
      f = cairn::make_error(cairn::errc::corrupt, "bad block " + std::to_string(comm.rank()))
              .with_rank(comm.rank());
    auto r = cairn::detail::agree_on_load(comm, f);
    REQUIRE(!r);
    CHECK(r.err().rank == 2);
    CHECK(r.err().code == cairn::errc::corrupt);
    CHECK(r.err().message.find("bad block 2") != std::string::npos);
    CHECK(cairn::detail::agree_on_load(comm, std::nullopt));
  });
}

TEST_CASE("the load's messages round-trip and refuse truncation") {
  cairn_test::check_message(cairn::detail::metadata_message{true, R"({"version": 4})"});
  cairn_test::check_message(std::vector<std::string>{"model.w", "optim.step"});
}
