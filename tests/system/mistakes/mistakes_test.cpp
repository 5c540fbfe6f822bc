// The mistakes a new user makes, each a test case: the error's code, and a message that names
// the fix (and the key, rank or path involved), in one readable shape (no doubled prefix).
// Issue 28's table; docs/tutorial.md links here.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/test_util.hpp"

namespace mistakes_test {

namespace fs = std::filesystem;

/// A fresh directory for one case, under the test's working directory.
inline fs::path fresh(const std::string& name) {
  fs::path p = fs::absolute("mistakes") / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// The error `f` raises, thrown (cairn::exception) or returned (a failed result).
template <class F>
cairn::error error_of(F&& f) {
  try {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
    } else {
      auto r = f();
      if constexpr (requires { r.has_value(); }) {
        if (!r) return r.err();
      }
    }
  } catch (const cairn::exception& e) {
    return e.err();
  }
  return cairn::error{cairn::errc::io, "NO ERROR RAISED"};
}

/// The shape every message has: "<code>: <message> [key=... rank=... file=...]", no segment
/// said twice in a row ("incomplete checkpoint: incomplete checkpoint: ..."), one line.
inline void check_shape(const cairn::error& e) {
  const std::string d = e.describe();
  INFO(d);
  CHECK(d.find('\n') == std::string::npos);
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    std::size_t next = d.find(": ", at);
    parts.push_back(d.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + 2;
  }
  for (std::size_t i = 1; i < parts.size(); ++i) CHECK(parts[i] != parts[i - 1]);
  CHECK(e.message.find(cairn::errc_name(e.code) + std::string(":")) != 0);
}

/// Checks code, shape, and that the message holds each of `says`.
inline void check(const cairn::error& e, cairn::errc code, std::vector<std::string> says) {
  const std::string d = e.describe();
  MESSAGE(d);
  CHECK(e.code == code);
  check_shape(e);
  for (const auto& s : says) {
    INFO("the message should say: ", s);
    CHECK(d.find(s) != std::string::npos);
  }
}

/// One tensor of 12 x 8 rows split over ranks, and a step.
struct rows_state {
  std::vector<float> buf;
  cairn::sharded_tensor<float> w;
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("", "w", "step");
};

/// The error of loading `s` on one rank from the checkpoint in `dir`.
template <class State>
cairn::error load_error(const fs::path& dir, State& s) {
  cairn::file_storage st(dir.string());
  cairn::single_communicator one;
  return error_of([&] { cairn::load(s, st, one); });
}

/// A per-rank object (an RNG state, say).
struct rng_state {
  cairn::sharded_object<std::int64_t> rng;
  static constexpr auto fields = cairn::field_names("rng");
};

/// `rows` x 8 floats, rank r of n holding the rows `split` gives it, and the step.
inline void describe_rows(rows_state& s,
                          std::int64_t rows_per_rank,
                          std::int64_t offset,
                          std::int64_t global_rows) {
  s.buf.assign(static_cast<std::size_t>(rows_per_rank * 8), 1.0f);
  s.w = cairn::block("w", std::span(s.buf), {rows_per_rank, 8}, {global_rows, 8}, {offset, 0});
}

/// Saves 12 x 8 rows evenly over `ranks` thread ranks into `dir`, step 100.
inline void save_rows(const fs::path& dir, int ranks) {
  cairn::file_storage st(dir.string());
  cairn::run_ranks(ranks, [&](cairn::thread_communicator& c) {
    rows_state s;
    auto part = cairn::even_split(12, c.rank(), c.size());
    s.buf.assign(static_cast<std::size_t>(part.size * 8), 1.0f);
    s.w = cairn::even_block("w", std::span(s.buf), {12, 8}, 0, c.rank(), c.size());
    s.step = 100;
    cairn::save(s, st, c);
  });
}

/// rows_state and a bias the checkpoint does not have.
struct more {
  rows_state base;
  std::vector<float> b = std::vector<float>(4);
  cairn::sharded_tensor<float> bias = cairn::replicated("bias", std::span(b), {4}, 0);
  static constexpr auto fields = cairn::field_names("", "", "bias");
};

/// rows_state's step as 32 bits.
struct narrow {
  std::vector<float> buf = std::vector<float>(96);
  cairn::sharded_tensor<float> w = cairn::replicated("w", std::span(buf), {12, 8}, 0);
  std::int32_t step = 0;
  static constexpr auto fields = cairn::field_names("", "w", "step");
};

}  // namespace mistakes_test

using namespace mistakes_test;

TEST_CASE("mistake: per-rank objects loaded on another world size without a mapping") {
  auto dir = fresh("objects");
  cairn::file_storage st(dir.string());
  cairn::run_ranks(2, [&](cairn::thread_communicator& c) {
    rng_state s{cairn::per_rank("rng", std::int64_t{c.rank()}, c.rank(), c.size())};
    cairn::save(s, st, c);
  });
  auto e = error_of([&] {
    cairn::run_ranks(3, [&](cairn::thread_communicator& c) {
      rng_state s{cairn::per_rank("rng", std::int64_t{-1}, c.rank(), c.size())};
      cairn::load(s, st, c);
    });
  });
  check(e, cairn::errc::mismatch, {"rng", "objects_modulo"});
}

TEST_CASE("mistake: every rank describes the same rows") {
  auto dir = fresh("overlap");
  cairn::file_storage st(dir.string());
  auto e = error_of([&] {
    cairn::run_ranks(2, [&](cairn::thread_communicator& c) {
      rows_state s;
      describe_rows(s, 12, 0, 12);  // all 12 rows on every rank, each claiming to be the copy
      cairn::save(s, st, c);
    });
  });
  check(e, cairn::errc::integrity, {"key=w", "replica_id", "even_block"});
}

TEST_CASE("mistake: a common value that differs across ranks") {
  auto dir = fresh("common");
  cairn::file_storage st(dir.string());
  auto e = error_of([&] {
    cairn::run_ranks(2, [&](cairn::thread_communicator& c) {
      rows_state s;
      describe_rows(s, 6, 6 * c.rank(), 12);
      s.step = 10 + c.rank();
      cairn::save(s, st, c);
    });
  });
  check(e, cairn::errc::integrity, {"key=step", "10 on rank 0", "11 on rank 1", "per_rank"});
}

TEST_CASE("mistake: a default-constructed tensor view") {
  auto dir = fresh("default_view");
  cairn::file_storage st(dir.string());
  cairn::single_communicator one;
  rows_state s;  // s.w never set
  auto e = error_of([&] { cairn::save(s, st, one); });
  check(e, cairn::errc::invalid_argument, {"key=w", "never set"});
}

TEST_CASE("mistake: a save over a committed checkpoint") {
  auto dir = fresh("twice");
  save_rows(dir, 1);
  auto e = error_of([&] { save_rows(dir, 1); });
  check(e, cairn::errc::already_exists, {dir.string(), "overwrite"});
}

TEST_CASE("mistake: a mistyped checkpoint path") {
  auto dir = fresh("typo");
  save_rows(dir / "step_000100", 1);
  rows_state s;
  describe_rows(s, 12, 0, 12);
  auto e = load_error(dir / "step_00100", s);
  check(e, cairn::errc::not_found, {"step_00100", "does not exist", "mistyped"});
}

TEST_CASE("mistake: a checkpointer root given as a checkpoint") {
  auto dir = fresh("root");
  cairn::file_storage root(dir.string());
  cairn::single_communicator one;
  {
    cairn::checkpointer ckpt(root, one, {.name = "step_{step:06}"});
    rows_state s;
    describe_rows(s, 12, 0, 12);
    s.step = 100;
    ckpt.save(s, {.step = 100});
    ckpt.finalize().value();
  }
  rows_state s;
  describe_rows(s, 12, 0, 12);
  auto e = error_of([&] { cairn::load(s, root, one); });
  check(e, cairn::errc::not_found,
        {"checkpointer's root", "latest` names step_000100", "load_latest", "cairn ls"});
}

TEST_CASE("mistake: a resume on 5 ranks of 12 rows split by n / size") {
  auto dir = fresh("split");
  save_rows(dir, 4);
  cairn::file_storage st(dir.string());
  auto e = error_of([&] {
    cairn::run_ranks(5, [&](cairn::thread_communicator& c) {
      rows_state s;
      s.buf.assign(12 / 5 * 8, 0.0f);
      s.w = cairn::from_rank_offsets("w", std::span(s.buf), {12 / 5, 8}, {{0, c.rank(), 5}});
      cairn::load(s, st, c);
    });
  });
  check(e, cairn::errc::mismatch, {"key=w", "[12, 8]", "[10, 8]", "even_block"});
}

TEST_CASE("mistake: a larger target shape") {
  auto dir = fresh("larger");
  save_rows(dir, 1);
  rows_state s;
  describe_rows(s, 16, 0, 16);
  auto e = load_error(dir, s);
  check(e, cairn::errc::mismatch, {"key=w", "[12, 8]", "[16, 8]", "allow_shape_mismatch"});
}

TEST_CASE("mistake: a key the checkpoint lacks") {
  auto dir = fresh("lacks");
  save_rows(dir, 1);
  more s;
  describe_rows(s.base, 12, 0, 12);
  auto e = load_error(dir, s);
  check(e, cairn::errc::not_found, {"key=bias", dir.string(), "strict"});
}

TEST_CASE("mistake: an I64 common value loaded into an I32") {
  auto dir = fresh("i64");
  save_rows(dir, 1);
  narrow s;
  auto e = load_error(dir, s);
  check(e, cairn::errc::mismatch, {"key=step", "I64", "I32", "saved type"});
}

TEST_CASE("mistake: an unwritable directory") {
  cairn::file_storage st("/proc/cairn-no-such-place/ckpt");
  rows_state s;
  describe_rows(s, 12, 0, 12);
  cairn::single_communicator one;
  auto e = error_of([&] { cairn::save(s, st, one); });
  check(e, cairn::errc::io, {"/proc/cairn-no-such-place"});
}

TEST_CASE("mistake: a parent path that is a regular file") {
  auto dir = fresh("file_parent");
  std::ofstream(dir / "notes.txt") << "not a directory";
  rows_state s;
  describe_rows(s, 12, 0, 12);
  cairn::single_communicator one;
  SUBCASE("save") {
    cairn::file_storage st((dir / "notes.txt" / "ckpt").string());
    auto e = error_of([&] { cairn::save(s, st, one); });
    check(e, cairn::errc::io, {"notes.txt", "Not a directory"});
  }
  SUBCASE("async checkpointer") {
    cairn::file_storage root((dir / "notes.txt" / "ckpts").string());
    auto e = error_of([&] {
      cairn::checkpointer ckpt(root, one, {.name = "step_{step:06}", .async = true});
      ckpt.save(s, {.step = 1});
      return ckpt.finalize();
    });
    check(e, cairn::errc::io, {"notes.txt", "Not a directory"});
  }
}

TEST_CASE("mistake: a name template without a changing field") {
  auto dir = fresh("template");
  cairn::file_storage root(dir.string());
  cairn::single_communicator one;
  rows_state s;
  describe_rows(s, 12, 0, 12);
  auto e = error_of([&] {
    cairn::checkpointer ckpt(root, one, {.name = "checkpoint"});
    ckpt.save(s, {.step = 1});
    ckpt.save(s, {.step = 2});
    return ckpt.finalize();
  });
  check(e, cairn::errc::invalid_argument, {"checkpoint", "{step"});
}
