// Save and load through typed trees: dtypes, commons, objects, errors, overwrite, failures.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/test_util.hpp"

using namespace cairn_test;

namespace {

enum class phase : std::int32_t { warmup = 1, stable = 2 };

struct layer_state {
  std::vector<float> w_buf, b_buf;
  cairn::sharded_tensor<float> w;
  cairn::sharded_tensor<cairn::bf16> b;
  static constexpr auto fields = cairn::field_names("", "", "w", "b");
};

struct rng_state {
  std::uint64_t s[4];
};

struct train_state {
  std::vector<float> w_data;
  std::vector<cairn::bf16> b_data;
  cairn::sharded_tensor<float> w;
  cairn::sharded_tensor<cairn::bf16> b;
  std::int64_t step = 0;
  double lr = 0;
  phase ph = phase::warmup;
  std::string run_name;
  std::vector<std::int32_t> schedule;
  std::map<std::string, double> metrics;
  std::optional<std::int64_t> maybe;
  cairn::sharded_object<rng_state> rng;
  cairn::local_non_persistent<std::vector<int>> scratch;
  static constexpr auto fields = cairn::field_names("",
                                                    "",
                                                    "w",
                                                    "b",
                                                    "step",
                                                    "lr",
                                                    "ph",
                                                    "run_name",
                                                    "schedule",
                                                    "metrics",
                                                    "maybe",
                                                    "rng",
                                                    "scratch");
};

/// Builds rank `rank` of `world`: w [8, 6] split along axis 0, b [6] replicated.
void make_state(train_state& s, int rank, int world, float seed) {
  s.w_data.resize(8 / world * 6);
  s.b_data.resize(6);
  for (std::size_t i = 0; i < s.w_data.size(); ++i)
    s.w_data[i] = seed + static_cast<float>(rank * 1000 + static_cast<int>(i));
  for (std::size_t i = 0; i < s.b_data.size(); ++i)
    s.b_data[i] = cairn::bf16(seed + static_cast<float>(i) / 8);
  s.w =
      cairn::from_rank_offsets("model.w", std::span(s.w_data), {8 / world, 6}, {{0, rank, world}});
  s.b = cairn::replicated("model.b", std::span(s.b_data), {6}, rank == 0 ? 0 : 1);
  s.rng = cairn::per_rank("rng", rng_state{{1u + rank, 2, 3, static_cast<std::uint64_t>(seed)}},
                          rank, world);
}

/// Fields that carry the values the test compares, not the views.
void set_commons(train_state& s, std::int64_t step) {
  s.step = step;
  s.lr = 3e-4;
  s.ph = phase::stable;
  s.run_name = "run-α";
  s.schedule = {1, 2, 3};
  s.metrics = {{"loss", 2.5}, {"tokens", 1e9}};
  s.maybe = 7;
}

}  // namespace

TEST_CASE("a typed tree saved on 4 ranks loads in place on 2 ranks") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 4, 1.0f);
    set_commons(s, 42);
    s.scratch.value = {1, 2, 3};
    cairn::save(s, disk, comm);
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 0.0f);
    std::fill(s.w_data.begin(), s.w_data.end(), -1.0f);
    s.maybe = 0;
    s.metrics = {{"loss", 0}, {"tokens", 0}};  // loaded in place: the same structure
    s.scratch.value = {9};
    s.rng = cairn::per_rank("rng", rng_state{}, comm.rank(), 4);  // ask for the saved grid
    cairn::load(s, disk, comm);
    // Rank r of 2 holds rows [4r, 4r+4): rows of saved ranks 2r and 2r+1.
    for (int row = 0; row < 4; ++row)
      for (int col = 0; col < 6; ++col) {
        int grow = comm.rank() * 4 + row;
        int saved_rank = grow / 2, local = (grow % 2) * 6 + col;
        CHECK(s.w_data[row * 6 + col] == 1.0f + static_cast<float>(saved_rank * 1000 + local));
      }
    for (int i = 0; i < 6; ++i) CHECK(float(s.b_data[i]) == float(cairn::bf16(1.0f + i / 8.0f)));
    CHECK(s.step == 42);
    CHECK(s.lr == 3e-4);
    CHECK(s.ph == phase::stable);
    CHECK(s.run_name == "run-α");
    CHECK(s.schedule == std::vector<std::int32_t>{1, 2, 3});
    CHECK(s.metrics.at("loss") == 2.5);
    CHECK(s.maybe == 7);
    CHECK(s.rng.value.s[0] == 1u + comm.rank());
    CHECK(s.scratch.value == std::vector<int>{9});  // untouched
  });
}

TEST_CASE("every dtype round-trips bit-exactly") {
  std::mt19937 rng(7);
  for (cairn::dtype t : cairn::all_dtypes) {
    CAPTURE(cairn::dtype_name(t));
    cairn::memory_storage mem;
    cairn::single_communicator comm;
    std::size_t es = cairn::dtype_size(t);
    std::vector<std::byte> data(257 * es), back(257 * es);
    for (auto& b : data) b = static_cast<std::byte>(rng());
    if (t == cairn::dtype::bool_)
      for (auto& b : data) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1u);
    auto make = [&](std::vector<std::byte>& buf) {
      cairn::sharded_tensor<> st;
      st.key = "x";
      st.type = t;
      st.local_shape = st.global_shape = {257};
      st.global_offset = {0};
      st.data = buf;
      cairn::state_dict sd;
      sd.add("x", st);
      return sd;
    };
    auto sd = make(data);
    cairn::save(sd, mem, comm);
    auto sd2 = make(back);
    cairn::load(sd2, mem, comm);
    CHECK(back == data);
    auto whole = cairn::load_tensors(mem, {"x"}).value();
    CHECK(whole.at("x").type == t);
    CHECK(whole.at("x").data == data);
  }
}

TEST_CASE("metadata-only inspection, common state alone, content metadata, selected keys") {
  cairn::memory_storage mem;
  cairn::save_options opt;
  opt.content_metadata = {{"model", "tiny"}, {"tp", "2"}};
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 5.0f);
    set_commons(s, 9);
    cairn::save(s, mem, comm, opt);
  });
  auto m = cairn::read_metadata(mem).value();
  CHECK(m.world_size == 2);
  CHECK(m.tensors.at("model.w").global_shape == cairn::shape{8, 6});
  CHECK(m.tensors.at("model.w").chunks.size() == 2);
  CHECK(m.tensors.at("model.b").chunks.size() == 1);  // replica written once
  CHECK(cairn::read_content_metadata(mem).value().at("model") == "tiny");
  auto commons = cairn::load_common(mem).value();
  CHECK(commons.at("step").as<std::int64_t>() == 9);
  CHECK(commons.at("run_name").as<std::string>() == "run-α");
  auto w = cairn::load_tensors(mem, {"model.w"}).value();
  auto vals = w.at("model.w").as<float>();
  REQUIRE(vals.size() == 48);
  CHECK(vals[0] == 5.0f);
  CHECK(vals[24] == 5.0f + 1000);
  // common_only leaves tensors alone
  cairn::single_communicator one;
  train_state s;
  make_state(s, 0, 1, 0.0f);
  s.rng = cairn::per_rank("rng", rng_state{}, 0, 2);
  std::fill(s.w_data.begin(), s.w_data.end(), -3.0f);
  cairn::load_options lo;
  lo.common_only = true;
  cairn::load(s, mem, one, lo);
  CHECK(s.step == 9);
  CHECK(s.w_data[0] == -3.0f);
}

TEST_CASE("a missing metadata.json means an incomplete checkpoint everywhere") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::single_communicator comm;
  train_state s;
  make_state(s, 0, 1, 1.0f);
  cairn::save(s, disk, comm);
  std::filesystem::remove(dir.path / "metadata.json");
  auto r = cairn::try_load(s, disk, comm);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::incomplete_checkpoint);
  CHECK(r.err().describe().find("incomplete checkpoint") != std::string::npos);
  auto v = cairn::verify_checkpoint(disk);
  REQUIRE(!v);
  CHECK(v.err().describe().find("incomplete checkpoint") != std::string::npos);
  CHECK(cairn::read_metadata(disk).err().code == cairn::errc::incomplete_checkpoint);
}

TEST_CASE("saving over a checkpoint needs overwrite, and the old one survives until commit") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 1.0f);
    set_commons(s, 1);
    cairn::save(s, disk, comm);
    auto again = cairn::try_save(s, disk, comm);
    REQUIRE(!again);
    CHECK(again.err().code == cairn::errc::already_exists);
  });
  // A failing overwrite at every possible write: the old checkpoint still loads.
  for (int fail_after = 0; fail_after < 6; ++fail_after) {
    CAPTURE(fail_after);
    cairn::faulty_storage<cairn::file_storage> faulty(disk);
    faulty.fail_after_writes(fail_after);
    std::vector<cairn::errc> codes(2);
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      train_state s;
      make_state(s, comm.rank(), 2, 2.0f);
      set_commons(s, 2);
      cairn::save_options o;
      o.overwrite = true;
      auto r = cairn::try_save(s, faulty, comm, o);
      codes[comm.rank()] = r ? cairn::errc::comm : r.err().code;
      if (!r)
        CHECK_MESSAGE(r.err().describe().find("injected") != std::string::npos, r.err().describe());
    });
    bool failed = codes[0] == cairn::errc::io;
    CHECK(codes[0] == codes[1]);  // every rank sees the same outcome
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      train_state s;
      make_state(s, comm.rank(), 2, 0.0f);
      cairn::load(s, disk, comm);
      CHECK(s.w_data[0] == (failed ? 1.0f : 2.0f) + comm.rank() * 1000);
      CHECK(s.step == (failed ? 1 : 2));
    });
    if (!failed) break;  // the save went through: nothing left to inject
  }
  // A successful overwrite removes the previous save's files.
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 3.0f);
    cairn::save_options o;
    o.overwrite = true;
    cairn::save(s, disk, comm, o);
  });
  auto m = cairn::read_metadata(disk).value();
  std::size_t data_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    std::string n = e.path().filename().string();
    if (n == "metadata.json") continue;
    bool referenced =
        std::any_of(m.files.begin(), m.files.end(), [&](const auto& f) { return f.name == n; });
    CHECK_MESSAGE(referenced, "leftover file " << n);
    ++data_files;
  }
  CHECK(data_files == m.files.size());
}

TEST_CASE("flipping any byte of a data or common file fails load and verify, naming the chunk") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::save_options so;
  so.block_size = 64;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 1.0f);
    set_commons(s, 5);
    cairn::save(s, disk, comm, so);
  });
  REQUIRE(cairn::verify_checkpoint(disk).value().empty());
  auto m = cairn::read_metadata(disk).value();
  for (std::uint32_t fi = 0; fi < m.files.size(); ++fi) {
    const auto& f = m.files[fi];
    // Index files (format version 4) are flipped byte by byte in index_v4_test.cpp.
    if (f.role == cairn::file_role::index) continue;
    auto path = dir.path / f.name;
    for (std::uint64_t off = 0; off < f.nbytes; ++off) {
      CAPTURE(f.name);
      CAPTURE(off);
      // Which key owns this byte?
      std::string owner;
      bool is_common = m.common && m.common->file == fi;
      for (const auto& [k, t] : m.tensors)
        for (const auto& c : t.chunks)
          if (c.where.file == fi && off >= c.where.byte_offset &&
              off < c.where.byte_offset + c.where.nbytes)
            owner = k;
      for (const auto& [k, o] : m.objects)
        if (o.where.file == fi && off >= o.where.byte_offset &&
            off < o.where.byte_offset + o.where.nbytes)
          owner = o.key;
      REQUIRE((is_common || !owner.empty()));
      auto flip = [&] {
        std::FILE* fp = std::fopen(path.c_str(), "r+b");
        std::fseek(fp, static_cast<long>(off), SEEK_SET);
        int c = std::fgetc(fp);
        std::fseek(fp, static_cast<long>(off), SEEK_SET);
        std::fputc(c ^ 0x10, fp);
        std::fclose(fp);
      };
      flip();
      auto problems = cairn::verify_checkpoint(disk).value();
      REQUIRE(problems.size() == 1);
      CHECK(problems[0].err.code == cairn::errc::corrupt);
      CHECK(problems[0].err.file == disk.describe(f.name));
      CHECK(problems[0].err.key == (is_common ? "" : owner));
      cairn::single_communicator one;
      train_state s;
      make_state(s, 0, 1, 0.0f);
      s.rng = cairn::per_rank("rng", rng_state{}, f.rank, 2);  // the shard this file holds
      auto r = cairn::try_load(s, disk, one);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::corrupt);
      CHECK(r.err().file == disk.describe(f.name));
      if (!is_common) CHECK(r.err().key == owner);
      CHECK(r.err().offset.has_value());
      flip();
    }
  }
  CHECK(cairn::verify_checkpoint(disk).value().empty());
}

TEST_CASE("access integrity: overlaps, gaps, dtype and common disagreements name key and ranks") {
  cairn::memory_storage mem;
  auto run = [&](auto&& per_rank) {
    std::vector<std::string> errors(2);
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<float> buf(8, 1.0f);
      cairn::state_dict sd;
      per_rank(sd, buf, comm.rank());
      auto r = cairn::try_save(sd, mem, comm);
      errors[comm.rank()] = r ? "" : r.err().describe();
    });
    CHECK(errors[0] == errors[1]);
    return errors[0];
  };
  auto overlap = run([](cairn::state_dict& sd, std::vector<float>& buf, int) {
    sd.add("w", cairn::replicated("w", std::span(buf), {8}, 0));
  });
  CHECK(overlap.find("overlap") != std::string::npos);
  CHECK(overlap.find("key=w") != std::string::npos);
  CHECK(overlap.find("rank 0 and rank 1") != std::string::npos);
  auto gap = run([](cairn::state_dict& sd, std::vector<float>& buf, int rank) {
    sd.add("w", cairn::block("w", std::span(buf).first(4), {4}, {16}, {rank * 4}));
  });
  CHECK(gap.find("gap") != std::string::npos);
  auto dt = run([](cairn::state_dict& sd, std::vector<float>& buf, int rank) {
    auto t = cairn::from_rank_offsets("w", std::span(buf).first(4), {4}, {{0, rank, 2}});
    cairn::sharded_tensor<> d = t;
    if (rank == 1) d.type = cairn::dtype::i32;
    sd.add("w", d);
  });
  CHECK(dt.find("dtype disagrees") != std::string::npos);
  auto common = run([](cairn::state_dict& sd, std::vector<float>&, int rank) {
    sd.add("step", std::int64_t{rank});
  });
  CHECK(common.find("common value differs across ranks: 0 on rank 0, 1 on rank 1") !=
        std::string::npos);
  auto dup = run([](cairn::state_dict& sd, std::vector<float>&, int) {
    sd.add("o", cairn::byte_object{"o", {}, {1}, {0}, 0});
  });
  CHECK(dup.find("saved by rank 0 and rank 1") != std::string::npos);
}

TEST_CASE("load errors: missing key, dtype and shape mismatch, shape mismatch allowed") {
  cairn::memory_storage mem;
  cairn::single_communicator comm;
  std::vector<float> buf{1, 2, 3, 4};
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(buf), {4}, 0));
  cairn::save(sd, mem, comm);

  std::vector<float> big(6, 9.0f);
  cairn::state_dict missing;
  missing.add("v", cairn::replicated("v", std::span(big).first(4), {4}, 0));
  auto r1 = cairn::try_load(missing, mem, comm);
  REQUIRE(!r1);
  CHECK(r1.err().code == cairn::errc::not_found);
  CHECK(r1.err().key == "v");

  std::vector<std::int32_t> ints(4);
  cairn::state_dict wrong_type;
  wrong_type.add("w", cairn::replicated("w", std::span(ints), {4}, 0));
  auto r2 = cairn::try_load(wrong_type, mem, comm);
  REQUIRE(!r2);
  CHECK(r2.err().code == cairn::errc::mismatch);
  CHECK(r2.err().describe().find("F32") != std::string::npos);

  cairn::state_dict padded;
  auto t = cairn::replicated("w", std::span(big), {6}, 0);
  padded.add("w", t);
  auto r3 = cairn::try_load(padded, mem, comm);
  REQUIRE(!r3);
  CHECK(r3.err().code == cairn::errc::mismatch);
  t.allow_shape_mismatch = true;
  padded.add("w", t);
  cairn::load(padded, mem, comm);
  CHECK(big == std::vector<float>{1, 2, 3, 4, 0, 0});
}

TEST_CASE("per-rank objects across a world-size change give a clear error") {
  cairn::memory_storage mem;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("rng", cairn::byte_object{"rng", {std::byte(comm.rank())}, {4}, {comm.rank()}, 0});
    cairn::save(sd, mem, comm);
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("rng", cairn::byte_object{"rng", {}, {2}, {comm.rank()}, 0});
    auto r = cairn::try_load(sd, mem, comm);
    REQUIRE(!r);
    CHECK(r.err().describe().find("topology changed") != std::string::npos);
    CHECK(r.err().describe().find("grid of [4] (world size 4)") != std::string::npos);
    CHECK(r.err().describe().find("objects_modulo") != std::string::npos);
  });
}

TEST_CASE("a newer format version is rejected with a clear error") {
  cairn::memory_storage mem;
  cairn::single_communicator comm;
  std::vector<float> buf{1};
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(buf), {1}, 0));
  cairn::save(sd, mem, comm);
  auto m = cairn::read_metadata(mem).value();
  m.version = cairn::format_version + 1;
  std::string json = cairn::to_json(m);
  REQUIRE(mem.put("metadata.json", std::as_bytes(std::span(json))));
  auto r = cairn::try_load(sd, mem, comm);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::unsupported_version);
}

TEST_CASE("invalid UTF-8 in a key is refused before anything is written") {
  cairn::memory_storage mem;
  cairn::single_communicator comm;
  std::vector<float> buf{1};
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("bad\xff", std::span(buf), {1}, 0));
  auto r = cairn::try_save(sd, mem, comm);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(mem.object_count() == 0);
}

TEST_CASE("a checkpoint with gaps (validation off) fails to load instead of leaving garbage") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.validate_access_integrity = false;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> buf(4, 1.0f);
    cairn::state_dict sd;
    if (comm.rank() == 0)
      sd.add("w", cairn::block("w", std::span(buf), {4}, {8}, {0}));
    else
      sd.add("w", cairn::block("w", std::span(buf), {4}, {8}, {4}, 1));  // a replica: not written
    cairn::save(sd, mem, comm, so);
  });
  cairn::single_communicator one;
  std::vector<float> all(8);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(all), {8}, 0));
  auto r = cairn::try_load(sd, mem, one);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "w");
}

TEST_CASE("metadata whose chunk sizes disagree with their boxes is rejected") {
  cairn::memory_storage mem;
  cairn::single_communicator comm;
  std::vector<float> buf{1, 2};
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(buf), {2}, 0));
  cairn::save(sd, mem, comm);
  auto m = cairn::read_metadata(mem).value();
  m.tensors.at("w").chunks[0].where.nbytes = 4;
  std::string json = cairn::to_json(m);
  REQUIRE(mem.put("metadata.json", std::as_bytes(std::span(json))));
  auto r = cairn::try_load(sd, mem, comm);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
}

namespace their {
struct rng {
  std::uint64_t seed = 0;
  cairn::sharded_object<std::uint64_t> as_object;  // what the adapter exposes, by reference
};
struct vec {
  std::vector<float> v;
};
}  // namespace their
template <>
struct cairn::adapter<their::rng> {
  static cairn::sharded_object<std::uint64_t>& view(their::rng& r) { return r.as_object; }
};
template <>
struct cairn::adapter<their::vec> {
  static cairn::sharded_tensor<float> view(their::vec& x) {
    return cairn::replicated("vec", std::span(x.v), {static_cast<std::int64_t>(x.v.size())}, 0);
  }
};
namespace {
struct adapted_state {
  their::rng rng;
  their::vec vec;
  static constexpr auto fields = cairn::field_names("rng", "vec");
};
}  // namespace

TEST_CASE("adapter views: by value for tensors, by reference for objects") {
  cairn::memory_storage mem;
  cairn::single_communicator comm;
  adapted_state s;
  s.rng.as_object = cairn::per_rank("rng", std::uint64_t{99}, 0, 1);
  s.vec.v = {1, 2, 3};
  cairn::save(s, mem, comm);
  adapted_state t;
  t.rng.as_object = cairn::per_rank("rng", std::uint64_t{0}, 0, 1);
  t.vec.v = {0, 0, 0};
  cairn::load(t, mem, comm);
  CHECK(t.rng.as_object.value == 99);
  CHECK(t.vec.v == std::vector<float>{1, 2, 3});
}

TEST_CASE("every rank reports the files it wrote, together they are the checkpoint") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
  const std::pair<const char*, const cairn::save_strategy*> strategies[] = {
      {"native", nullptr}, {"torch_dist", &torch_dist}, {"one_file", &one_file}};
  for (auto [name, strategy] : strategies) {
    for (bool async : {false, true}) {
      const std::string layout = name;
      CAPTURE(layout);
      CAPTURE(async);
      cairn::memory_storage mem;
      std::mutex mu;
      std::vector<std::vector<std::string>> files(3);
      cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
        std::vector<float> w(8 * 4, static_cast<float>(comm.rank()));
        std::vector<std::int64_t> ids(6, 1);
        cairn::state_dict sd;
        sd.add("w", cairn::from_rank_offsets("w", std::span(w), {8, 4}, {{0, comm.rank(), 3}}));
        sd.add("ids", cairn::replicated("ids", std::span(ids), {6}, comm.rank()));
        if (strategy != &one_file) sd.add("step", std::int64_t{4});  // safetensors: tensors only
        cairn::save_options so;
        so.strategy = strategy;
        cairn::save_stats stats;
        if (async) {
          cairn::async_saver saver;
          saver.save(sd, mem, comm, so).value();
          stats = saver.finalize().value();
        } else {
          stats = cairn::save(sd, mem, comm, so);
        }
        std::lock_guard lock(mu);
        files[static_cast<std::size_t>(comm.rank())] = stats.files;
      });
      std::set<std::string> reported;
      for (const auto& f : files) reported.insert(f.begin(), f.end());
      const auto stored = mem.list("").value();
      std::string got, want;
      for (const auto& f : reported) got += f + " ";
      for (const auto& f : stored) want += f + " ";
      CAPTURE(got);
      CAPTURE(want);
      CHECK(reported == std::set<std::string>(stored.begin(), stored.end()));
      // Rank 0 commits: the metadata is the last object it wrote.
      REQUIRE(!files[0].empty());
      if (strategy == nullptr) CHECK(files[0].back() == "metadata.json");
      if (strategy == &torch_dist) CHECK(files[0].back() == ".metadata");
    }
  }
}

namespace {

/// One rank's part of a 12-element tensor "w" in blocks of 4 over 3 ranks, every element `value`.
struct w_block {
  std::vector<float> w;
  cairn::state_dict sd;
  w_block(int rank, float value) : w(4, value) {
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4}, {{0, rank, 3}}));
  }
};

/// Saves `value` on 3 ranks: the checkpoint the failures below must leave loadable.
void save_base(cairn::memory_storage& mem, float value) {
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    w_block b(comm.rank(), value);
    cairn::save(b.sd, mem, comm, {.overwrite = true});
  });
}

/// Whether every rank loads `value` back.
bool loads_value(cairn::memory_storage& mem, float value) {
  std::atomic<int> bad{0};
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    w_block b(comm.rank(), -1.0f);
    cairn::load(b.sd, mem, comm);
    if (b.w != std::vector<float>(4, value)) ++bad;
  });
  return bad == 0;
}

thread_local int stalled_here = 0;  // set on the thread of the rank whose storage stalls

/// Memory storage whose writers open only once `release` is true, on the stalled rank's
/// thread: a disk that hangs under one rank.
class hanging_storage : public cairn::storage_decorator<cairn::memory_storage> {
 public:
  using decorator = cairn::storage_decorator<cairn::memory_storage>;
  explicit hanging_storage(cairn::memory_storage& m) : decorator(m) {}
  std::atomic<bool> release{false};
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    if (stalled_here)
      while (!release.load()) std::this_thread::yield();
    return decorator::open_writer(name);
  }
};

/// Runs `f(comm, wait)` on 3 ranks with a 1 s deadline, where `wait()` stalls rank 1 until the
/// other two have failed, and checks that every rank failed with errc::comm naming rank 1.
template <class F>
void every_rank_names_rank_1(F&& f) {
  std::vector<std::optional<cairn::error>> errors(3);
  std::atomic<int> failed{0};
  cairn::run_ranks(3, std::chrono::milliseconds(1000), [&](cairn::thread_communicator& comm) {
    auto wait_for_others = [&] {
      while (failed.load() < 2) std::this_thread::yield();
    };
    auto r = f(comm, wait_for_others);
    if (!r) errors[static_cast<std::size_t>(comm.rank())] = r.err();
    ++failed;
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK(e->code == cairn::errc::comm);
    CHECK(cairn_test::names_missing(e->describe(), 1));
  }
}

}  // namespace

TEST_CASE("a rank stalled before the save fails every rank's save, the last checkpoint loads") {
  cairn::memory_storage mem;
  save_base(mem, 1.0f);
  every_rank_names_rank_1([&](cairn::thread_communicator& comm, auto wait) {
    w_block b(comm.rank(), 2.0f);
    if (comm.rank() == 1) wait();  // stalls until the others have given up on it
    return cairn::try_save(b.sd, mem, comm, {.overwrite = true});
  });
  CHECK(loads_value(mem, 1.0f));  // the previous checkpoint, whole
}

TEST_CASE("a rank whose write hangs fails every rank's save at the commit, naming it") {
  cairn::memory_storage mem;
  save_base(mem, 1.0f);
  hanging_storage hanging(mem);
  every_rank_names_rank_1([&](cairn::thread_communicator& comm, auto wait) {
    w_block b(comm.rank(), 2.0f);
    stalled_here = comm.rank() == 1;
    std::thread release;
    if (stalled_here)  // the disk comes back once the others have given up
      release = std::thread([&, wait] {
        wait();
        hanging.release = true;
      });
    auto r = cairn::try_save(b.sd, hanging, comm, {.overwrite = true});
    if (release.joinable()) release.join();
    stalled_here = 0;
    return r;
  });
  CHECK(loads_value(mem, 1.0f));
}

TEST_CASE("a rank stalled before the load fails every rank's load, naming it") {
  cairn::memory_storage mem;
  save_base(mem, 3.0f);
  every_rank_names_rank_1([&](cairn::thread_communicator& comm, auto wait) {
    w_block b(comm.rank(), 0.0f);
    if (comm.rank() == 1) wait();
    return cairn::try_load(b.sd, mem, comm);
  });
  CHECK(loads_value(mem, 3.0f));
}

TEST_CASE("a rank that dies during the save fails every other rank's save, naming it") {
  cairn::memory_storage mem;
  save_base(mem, 4.0f);
  std::vector<std::optional<cairn::error>> errors(3);
  CHECK_THROWS_AS(cairn::run_ranks(3, std::chrono::milliseconds(1000),
                                   [&](cairn::thread_communicator& comm) {
                                     w_block b(comm.rank(), 5.0f);
                                     if (comm.rank() == 1)
                                       throw std::runtime_error("rank 1 was killed");
                                     auto r = cairn::try_save(b.sd, mem, comm, {.overwrite = true});
                                     if (!r)
                                       errors[static_cast<std::size_t>(comm.rank())] = r.err();
                                   }),
                  std::runtime_error);
  for (int r : {0, 2}) {
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)]->code == cairn::errc::comm);
    CHECK(errors[static_cast<std::size_t>(r)]->describe().find("rank 1") != std::string::npos);
  }
  CHECK(loads_value(mem, 4.0f));
}
