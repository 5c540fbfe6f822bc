// tests/cairn_test.cpp: cairn/cairn.hpp, the umbrella: with that one include, a user describes
// state (a struct with sharded tensors, common values, a per-rank object and a non-persistent
// field, or a state_dict), saves it from two thread ranks into files, loads it back on one and
// on three ranks, reads parts without a tree, gets the documented errors, and runs a
// checkpointer over memory:// storage.
#include "cairn/cairn.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace umbrella_test {

/// One rank's state: rows [rank * 4 / world, ...) of an [4, 3] f32 weight, split by rows.
struct state {
  std::vector<float> w_buf;
  cairn::sharded_tensor<float> w;
  std::int64_t step = 0;
  std::string run;
  cairn::sharded_object<std::uint64_t> seed;
  cairn::local_non_persistent<std::vector<float>> scratch;
  static constexpr auto fields = cairn::field_names("", "w", "step", "run", "seed", "scratch");
};

/// `world` must divide 4. Element (i, j) of the global weight is 10 i + j (+ `bias`).
inline void make(state& s, int rank, int world, float bias) {
  const int rows = 4 / world;
  s.w_buf.resize(static_cast<std::size_t>(rows) * 3);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < 3; ++j)
      s.w_buf[static_cast<std::size_t>(i * 3 + j)] =
          bias + static_cast<float>(10 * (rank * rows + i) + j);
  s.w = cairn::from_rank_offsets("w", std::span(s.w_buf), {rows, 3}, {{0, rank, world}});
  s.seed = cairn::per_rank("seed", std::uint64_t{0}, rank, world);
}

/// A fresh directory, removed at scope exit.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "cairn-umbrella-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace umbrella_test

TEST_CASE("save from two thread ranks into files, load on one and on three ranks") {
  umbrella_test::scratch_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    umbrella_test::state s;
    umbrella_test::make(s, comm.rank(), 2, 0.5f);
    s.step = 100;
    s.run = "tiny";
    s.seed.value = 1000 + static_cast<std::uint64_t>(comm.rank());
    s.scratch.value = {1, 2, 3};
    cairn::save(s, disk, comm);
  });

  SUBCASE("one rank reads the whole tensor, the commons and the tree-less views") {
    umbrella_test::state s;
    umbrella_test::make(s, 0, 1, -100);
    cairn::single_communicator one;
    // The per-rank seed was saved on a grid of 2: without a mapping, the changed topology is
    // an error naming the object; objects_modulo() loads rank 0's.
    auto refused = cairn::try_load(s, disk, one);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.err().code == cairn::errc::mismatch);
    CHECK(refused.err().key == "seed");
    cairn::load_options opt;
    opt.object_mapping = cairn::objects_modulo();
    cairn::load(s, disk, one, opt);
    CHECK(s.seed.value == 1000);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        CHECK(s.w_buf[static_cast<std::size_t>(i * 3 + j)] ==
              0.5f + static_cast<float>(10 * i + j));
    CHECK(s.step == 100);
    CHECK(s.run == "tiny");
    CHECK(s.scratch.value.empty());  // never saved, never loaded
    CHECK(cairn::load_common(disk).value().at("step").as<std::int64_t>() == 100);
    auto t = cairn::load_tensors(disk, {"w"}).value();
    CHECK(t.at("w").global_shape == cairn::shape{4, 3});
    CHECK(t.at("w").as<float>()[11] == 32.5f);
  }
  SUBCASE("the rows reshard onto another number of ranks") {
    // 3 ranks: rank r wants rows [r, r + 1] of 4 (overlapping, as replicas would).
    auto firsts = cairn::run_ranks_collect(3, [&](cairn::thread_communicator& comm) {
      std::vector<float> rows(6, -1);
      cairn::sharded_tensor<float> t;
      t.key = "w";
      t.local_shape = {2, 3};
      t.global_shape = {4, 3};
      t.global_offset = {comm.rank(), 0};
      t.data = rows;
      cairn::state_dict want;
      want.add("w", t);
      cairn::load(want, disk, comm);
      return rows;
    });
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 6; ++k)
        CHECK(firsts[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)] ==
              0.5f + static_cast<float>(10 * (r + k / 3) + k % 3));
  }
}

TEST_CASE("the documented errors: no checkpoint, an existing one, a mismatched target") {
  cairn::memory_storage mem;
  cairn::single_communicator one;
  umbrella_test::state s;
  umbrella_test::make(s, 0, 1, 0);
  auto missing = cairn::try_load(s, mem, one);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == cairn::errc::not_found);  // nothing there at all
  CHECK_THROWS_AS(cairn::load(s, mem, one), cairn::exception);

  cairn::save(s, mem, one);
  auto again = cairn::try_save(s, mem, one);
  REQUIRE_FALSE(again.has_value());
  CHECK(again.err().code == cairn::errc::already_exists);
  CHECK(cairn::try_save(s, mem, one, {.overwrite = true}).has_value());

  // A target whose global shape differs names the tensor.
  std::vector<float> other(8);
  cairn::state_dict wrong;
  wrong.add("w", cairn::replicated("w", std::span(other), {8}, 0));
  auto r = cairn::try_load(wrong, mem, one);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().code == cairn::errc::mismatch);
  CHECK(r.err().key == "w");
}

TEST_CASE("a checkpointer over memory:// keeps the last checkpoints and resumes the newest") {
  cairn::single_communicator one;
  cairn::checkpointer ckpt("memory://umbrella_test", one, {.keep_last = 2});
  umbrella_test::state s;
  umbrella_test::make(s, 0, 1, 0);
  for (std::int64_t step : {10, 20, 30}) {
    s.step = step;
    auto saved = ckpt.save(s, {.step = step});
    CHECK(saved.name == "step000000" + std::to_string(step));
  }
  auto names = ckpt.list().value();
  CHECK(names.size() == 2);

  umbrella_test::state back;
  umbrella_test::make(back, 0, 1, -1);
  auto loaded = ckpt.load_latest(back).value();
  REQUIRE(loaded.has_value());
  CHECK(loaded->name == "step00000030");
  CHECK(loaded->counters.step == 30);
  CHECK(back.step == 30);
  CHECK(back.w_buf[4] == 11.0f);
}
