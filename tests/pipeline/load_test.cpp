// The phases of a load (pipeline/load.hpp) below load(): metadata read once and shared, records
// matched to targets, objects found on a changed grid, strict keys across ranks, pieces read once
// and broadcast, verified reads, and every rank agreeing on the lowest failing rank's error.
#include "cairn/pipeline/load.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/counting_comm.hpp"
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

/// A tensor leaf over `data` for box `b` of tensor `key` (f32, `global`).
inline cairn::tensor_leaf leaf(const std::string& key,
                               std::vector<float>& data,
                               const cairn::shape& global,
                               const cairn::box& b) {
  cairn::tensor_leaf t;
  t.path = key;
  t.sharding.key = key;
  t.sharding.type = cairn::dtype::f32;
  t.sharding.global_shape = global;
  t.sharding.local_shape = b.size;
  t.sharding.global_offset = b.offset;
  t.data = reinterpret_cast<std::byte*>(data.data());
  t.nbytes = data.size() * 4;
  return t;
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
  auto t = pipeline_load_test::leaf("w", buf, {4, 3}, cairn::box{{0, 0}, {4, 3}});
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
  auto padded = pipeline_load_test::leaf("w", wide, {4, 5}, cairn::box{{0, 0}, {4, 5}});
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
  leaves.tensors.push_back(pipeline_load_test::leaf("w", col, {4, 3}, cairn::box{{0, 1}, {4, 1}}));
  leaves.tensors.push_back(pipeline_load_test::leaf("w", row, {4, 3}, cairn::box{{2, 0}, {1, 3}}));
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
  whole.tensors.push_back(pipeline_load_test::leaf("w", all, {4, 3}, cairn::box{{0, 0}, {4, 3}}));
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
      leaves.tensors.push_back(pipeline_load_test::leaf("w", a, {4, 3}, {{0, 0}, {4, 3}}));
    else
      leaves.tensors.push_back(pipeline_load_test::leaf("zzz", b, {40000}, {{0}, {40000}}));
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

TEST_CASE("pieces every rank asks for alike are read by one rank and broadcast") {
  cairn::memory_storage mem;
  pipeline_load_test::save_sample(mem);
  std::vector<std::vector<int>> readers(3);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> b(40000, -1.0f), b2(40000, -1.0f), w(4, -1.0f);
    cairn::leaf_list leaves;
    leaves.tensors.push_back(pipeline_load_test::leaf("b", b, {40000}, {{0}, {40000}}));
    leaves.tensors.push_back(pipeline_load_test::leaf("b", b2, {40000}, {{0}, {40000}}));
    // Small, and different on every rank: never shared.
    leaves.tensors.push_back(pipeline_load_test::leaf("w", w, {4, 3}, {{r, 0}, {1, 3}}));
    auto shared = cairn::detail::plan_shared_pieces(leaves, comm, {});
    REQUIRE(shared.size() == 1);  // one (key, box) asked alike: the two local copies are one
    CHECK(shared[0].nbytes == 160000);
    readers[r].push_back(shared[0].reader);
    CHECK(cairn::detail::plan_shared_pieces(leaves, comm, {.read_once_broadcast = false}).empty());
    CHECK(
        cairn::detail::plan_shared_pieces(leaves, comm, {.broadcast_min_bytes = 1 << 20}).empty());

    // The reader's bytes reach every rank.
    if (r == shared[0].reader)
      for (int i = 0; i < 40000; ++i) (shared[0].local.first == 0 ? b : b2)[i] = 3.0f;
    cairn::detail::broadcast_shared_pieces(shared, comm);
    const auto& got = shared[0].local.first == 0 ? b : b2;
    CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 3.0f; }));
  });
  CHECK(readers[0] == readers[1]);
  CHECK(readers[1] == readers[2]);
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
  cairn_test::check_message(std::vector<cairn::detail::wanted_piece>{
      {"model.w", cairn::box{{0, 8}, {4, 8}}}, {"b", cairn::box{{2}, {2}}}});
  cairn_test::check_message(std::vector<cairn::detail::shared_verdict>{
      {"model.w", cairn::box{{0, 8}, {4, 8}}, 3}, {"b", cairn::box{{2}, {2}}, 0}});
}

TEST_CASE("a load on 64 ranks finds the shared pieces without gathering every rank's requests") {
  constexpr int world = 64;
  cairn::memory_storage mem;
  const auto state = [](int r, std::vector<float>& w, std::vector<float>& b,
                        cairn::state_dict& sd) {
    for (int i = 0; i < 64; ++i) {
      const std::string wk = "layer" + std::to_string(i) + ".weight";
      const std::string bk = "layer" + std::to_string(i) + ".bias";
      sd.add(wk, cairn::from_rank_offsets(wk, std::span(w).subspan(16 * i, 16), {2, 8},
                                          {{0, r, world}}));
      sd.add(bk, cairn::replicated(bk, std::span(b).subspan(8 * i, 8), {8}, r));
    }
  };
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(64 * 16), b(64 * 8);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(comm.rank() * 10000 + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    cairn::save(sd, mem, comm);
  });
  std::vector<std::size_t> exchanged(world), shared(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    std::vector<cairn_test::collective_use> log;
    cairn_test::counting_comm comm{tc, &log};
    std::vector<float> w(64 * 16, -1.0f), b(64 * 8, -1.0f);
    cairn::state_dict sd;
    state(tc.rank(), w, b, sd);
    // Every bias (32 bytes) is asked for by every rank: all are shared with this threshold.
    cairn::load(sd, mem, comm, {.broadcast_min_bytes = 32});
    for (std::size_t i = 0; i < w.size(); ++i)
      REQUIRE(w[i] == static_cast<float>(tc.rank() * 10000 + i));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == static_cast<float>(i));
    std::size_t other = 0, broadcasts = 0;
    for (const auto& u : log) {
      if (u.kind == "broadcast") ++broadcasts;
      if (u.kind != "broadcast") other += u.received;
    }
    exchanged[static_cast<std::size_t>(tc.rank())] = other;
    shared[static_cast<std::size_t>(tc.rank())] = broadcasts;
  });
  std::size_t most = *std::max_element(exchanged.begin(), exchanged.end());
  MESSAGE("most bytes a rank received outside broadcasts: " << most);
  // Every rank asks for 128 pieces (about 60 bytes each encoded): gathering every rank's
  // requests brought each rank 491 KB. Now a rank receives the claims on the keys it owns (64
  // per key) and a verdict per bias.
  CHECK(most < 64 * 1024);
  for (std::size_t n : shared) CHECK(n > 64);  // the metadata, then the 64 biases one by one
}

TEST_CASE("the shared piece filter holds every piece all ranks want, on every rank alike") {
  constexpr int world = 8;
  std::vector<cairn::bytes> filters(world);
  std::vector<int> common_missed(world), private_passed(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<std::uint64_t> common, mine;
    for (int i = 0; i < 100; ++i)
      common.push_back(cairn::detail::piece_hash("bias" + std::to_string(i), {{0}, {64}}));
    for (int i = 0; i < 300; ++i)  // this rank's row block of 300 weights
      mine.push_back(
          cairn::detail::piece_hash("w" + std::to_string(i), {{4 * comm.rank(), 0}, {4, 64}}));
    std::vector<std::uint64_t> all = common;
    all.insert(all.end(), mine.begin(), mine.end());
    cairn::bytes f = cairn::detail::common_piece_filter(all, comm);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (std::uint64_t h : common) common_missed[r] += !cairn::detail::filter_may_hold(f, h);
    for (std::uint64_t h : mine) private_passed[r] += cairn::detail::filter_may_hold(f, h);
    filters[r] = std::move(f);
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(filters[static_cast<std::size_t>(r)] == filters[0]);
    CHECK(common_missed[static_cast<std::size_t>(r)] == 0);
    CHECK(private_passed[static_cast<std::size_t>(r)] <= 3);  // the filter's rare false positives
  }
  CHECK(filters[0].size() == 1024);  // 16 bits per piece of the busiest rank (400), rounded up
  // A rank that would share nothing: no piece is common, every rank gets an empty filter.
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::vector<std::uint64_t> h;
    if (comm.rank() != 1) h.push_back(cairn::detail::piece_hash("b", {{0}, {8}}));
    CHECK(cairn::detail::common_piece_filter(h, comm).empty());
  });
}

TEST_CASE("a load whose ranks share no piece exchanges only the shared piece filter") {
  // 16 ranks in 2 pipeline stages of 8: each stage holds its own 32 weights, split by rows over
  // its 8 ranks, and its own replicated biases: no piece is wanted by every rank.
  constexpr int world = 16;
  cairn::memory_storage mem;
  const auto state = [](int r, std::vector<float>& w, std::vector<float>& b,
                        cairn::state_dict& sd) {
    const int stage = r / 8;
    for (int i = 0; i < 32; ++i) {
      const std::string layer = "layer" + std::to_string(2 * i + stage);
      sd.add(layer + ".weight",
             cairn::from_rank_offsets(layer + ".weight", std::span(w).subspan(16 * i, 16), {2, 8},
                                      {{0, r % 8, 8}}));
      sd.add(layer + ".bias",
             cairn::replicated(layer + ".bias", std::span(b).subspan(8 * i, 8), {8}, r % 8));
    }
  };
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(32 * 16), b(32 * 8);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(comm.rank() * 1000 + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(comm.rank() / 8 + i);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    cairn::save(sd, mem, comm);
  });
  std::vector<std::size_t> to_owners(world), broadcasts(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    std::vector<cairn_test::collective_use> log;
    cairn_test::counting_comm comm{tc, &log};
    std::vector<float> w(32 * 16, -1.0f), b(32 * 8, -1.0f);
    cairn::state_dict sd;
    state(tc.rank(), w, b, sd);
    cairn::load(sd, mem, comm, {.broadcast_min_bytes = 32});
    for (std::size_t i = 0; i < w.size(); ++i)
      REQUIRE(w[i] == static_cast<float>(tc.rank() * 1000 + i));
    for (std::size_t i = 0; i < b.size(); ++i)
      REQUIRE(b[i] == static_cast<float>(tc.rank() / 8 + i));
    std::size_t sent = 0, n = 0;
    for (const auto& u : log) {
      if (u.kind == "broadcast") ++n;
      if (u.kind == "all_to_all") sent += u.sent;
    }
    to_owners[static_cast<std::size_t>(tc.rank())] = sent;
    broadcasts[static_cast<std::size_t>(tc.rank())] = n;
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    // Each rank would share 64 pieces; the filter drops every one: what a rank sends through
    // all_to_all is its filter's segments (64 pieces x 16 bits, 128 bytes) and the claims'
    // empty lists, not 64 claims of about 30 bytes each.
    CHECK(to_owners[static_cast<std::size_t>(r)] < 512);
    CHECK(broadcasts[static_cast<std::size_t>(r)] == 1);  // the metadata only
  }
}
