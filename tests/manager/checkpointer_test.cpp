// The checkpoint manager on thread ranks: name templates, the same-name check across ranks,
// `latest` moved only after a commit (sync and async), load_latest from the pointer or by a
// scan when the pointer is missing or stale, retention rules, tags, failures of the pointer
// and of deletions.
#include "cairn/manager/checkpointer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/prefixed.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/counting_comm.hpp"
#include "tests/support/message_check.hpp"
#include "tests/support/test_util.hpp"

namespace {

/// A [rows, 4] f32 tensor in row blocks over `world` ranks, values `step * 1000 + index`, and
/// the step as a common value.
struct model {
  std::vector<float> w;
  cairn::state_dict sd;
  model(int rank, int world, std::int64_t step_value, std::int64_t rows = 24) {
    const std::int64_t n = rows / world;
    w.resize(static_cast<std::size_t>(n * 4));
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(step_value * 1000 + rank * n * 4 + static_cast<std::int64_t>(i));
    sd.add("w", cairn::block("w", std::span(w), {n, 4}, {rows, 4}, {rank * n, 0}));
    sd.add("step", step_value);
  }
  /// Whether the values are those of `step_value`.
  bool holds(int rank, int world, std::int64_t step_value, std::int64_t rows = 24) const {
    const std::int64_t n = rows / world;
    for (std::size_t i = 0; i < w.size(); ++i)
      if (w[i] !=
          static_cast<float>(step_value * 1000 + rank * n * 4 + static_cast<std::int64_t>(i)))
        return false;
    return true;
  }
};

/// Saves the model at each of `steps` on `world` ranks through one checkpointer per rank.
void save_steps(cairn::storage_ref root,
                int world,
                const std::vector<std::int64_t>& steps,
                const cairn::checkpointer_options& opt = {}) {
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    cairn::checkpointer ckpt(root, comm, opt);
    for (std::int64_t s : steps) {
      model m(comm.rank(), world, s);
      auto r = ckpt.save(m.sd, {.step = s});
      CHECK(r.name == "step" + std::string(8 - std::to_string(s).size(), '0') + std::to_string(s));
    }
    REQUIRE(ckpt.finalize());
  });
}

/// Loads the latest checkpoint on `world` ranks: its step (-1: none) after checking the values.
std::int64_t latest_step(cairn::storage_ref root,
                         int world,
                         const cairn::checkpointer_options& opt = {},
                         bool* scanned = nullptr) {
  std::atomic<std::int64_t> step{-2};
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    cairn::checkpointer ckpt(root, comm, opt);
    model m(comm.rank(), world, 0);
    auto r = ckpt.load_latest(m.sd);
    REQUIRE(r);
    if (!*r) {
      step = -1;
      return;
    }
    const std::int64_t loaded = (*r)->counters.step;
    CHECK(m.holds(comm.rank(), world, loaded));
    if (comm.rank() == 0) {
      step = loaded;
      if (scanned) *scanned = (*r)->found_by_scan;
    }
  });
  return step.load();
}

/// The text of pointer object `name` (`latest` by default).
std::string pointer(cairn::memory_storage& mem, const std::string& name = "latest") {
  return cairn_test::read_text(mem, name);
}

std::vector<std::string> checkpoint_names(cairn::storage_ref root) {
  std::vector<std::string> out;
  for (const auto& e : cairn::list_checkpoints(root, nullptr).value())
    if (e.complete) out.push_back(e.name);
  return out;
}

/// Memory storage whose puts or removes of names `fails(op, name)` says fail.
class failing_storage : public cairn::storage_decorator<cairn::memory_storage> {
 public:
  using decorator = cairn::storage_decorator<cairn::memory_storage>;
  std::function<bool(std::string_view op, std::string_view name)> fails;
  explicit failing_storage(cairn::memory_storage& m) : decorator(m) {}
  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    if (fails && fails("put", name)) return injected(name);
    return decorator::put(name, data);
  }
  cairn::result<void> remove(std::string_view name) {
    if (fails && fails("remove", name)) return injected(name);
    return decorator::remove(name);
  }

 private:
  static cairn::error injected(std::string_view name) {
    return cairn::make_error(cairn::errc::io, "injected failure").with_file(std::string(name));
  }
};

}  // namespace

TEST_SUITE("checkpointer") {
  TEST_CASE("saves every N steps, latest names the newest, load_latest resumes on another world") {
    cairn::memory_storage mem;
    CHECK(latest_step(mem, 2) == -1);  // a fresh start
    save_steps(mem, 4, {10, 20});
    CHECK(pointer(mem) == "step00000020\n");
    CHECK(checkpoint_names(mem) == std::vector<std::string>{"step00000010", "step00000020"});
    bool scanned = true;
    CHECK(latest_step(mem, 2, {}, &scanned) == 20);
    CHECK(!scanned);
    CHECK(latest_step(mem, 3) == 20);
    // The counters come back whole from the content metadata.
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm);
      model m(comm.rank(), 2, 0);
      auto r = ckpt.load(m.sd, "step00000010").value();
      CHECK(r.counters.step == 10);
      CHECK(m.holds(comm.rank(), 2, 10));
      auto missing = ckpt.load(m.sd, "step00000030");
      REQUIRE(!missing);
      CHECK(missing.err().code == cairn::errc::not_found);
    });
  }

  TEST_CASE("every rank must name the same checkpoint, or nothing is written") {
    cairn::memory_storage mem;
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm);
      model m(comm.rank(), 4, 1);
      auto r = ckpt.try_save(m.sd, {.step = comm.rank() == 2 ? 11 : 10});
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      CHECK(r.err().message.find("ranks 0,1,3 \"step00000010\"") != std::string::npos);
      CHECK(r.err().message.find("rank 2 \"step00000011\"") != std::string::npos);
      auto t = ckpt.try_save(m.sd, {.step = 10}, {comm.rank() == 0 ? "best" : "other"});
      REQUIRE(!t);
      CHECK(t.err().code == cairn::errc::invalid_argument);
    });
    CHECK(mem.list("").value().empty());
  }

  TEST_CASE("latest moves only after the commit: a failed save leaves it on the previous one") {
    cairn::memory_storage mem;
    failing_storage flaky(mem);
    save_steps(flaky, 2, {10});
    for (const char* site : {"step00000020/metadata.json", "step00000020/index.", "latest"}) {
      CAPTURE(site);
      flaky.fails = [&](std::string_view op, std::string_view name) {
        return op == "put" && name.starts_with(site);
      };
      cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
        cairn::checkpointer ckpt(flaky, comm, {.overwrite = true});
        model m(comm.rank(), 2, 20);
        auto r = ckpt.try_save(m.sd, {.step = 20});
        REQUIRE(!r);
        if (std::string(site) == "latest")
          CHECK(r.err().message.find("is committed, but pointer \"latest\"") != std::string::npos);
      });
      flaky.fails = nullptr;
      CHECK(pointer(mem) == "step00000010\n");
    }
    // The pointer is trusted while it names a committed checkpoint, even an older one.
    CHECK(latest_step(mem, 2) == 10);
  }

  TEST_CASE("a missing or stale pointer: the newest committed checkpoint is found by a scan") {
    cairn::memory_storage mem;
    save_steps(mem, 2, {10, 30, 20});
    CHECK(pointer(mem) == "step00000020\n");
    REQUIRE(mem.remove("latest"));
    bool scanned = false;
    CHECK(latest_step(mem, 2, {}, &scanned) == 30);  // the highest step, not the last written
    CHECK(scanned);
    // A pointer to an incomplete checkpoint (a save killed before its commit), and one to
    // nothing: the scan again, never the incomplete one.
    const std::string partial = "data";
    REQUIRE(mem.put("step00000040/data.0.x.cairn", std::as_bytes(std::span(partial))));
    for (const char* target : {"step00000040\n", "nowhere\n", "../escape\n", ""}) {
      CAPTURE(target);
      const std::string t = target;
      REQUIRE(mem.put("latest", std::as_bytes(std::span(t))));
      scanned = false;
      CHECK(latest_step(mem, 3, {}, &scanned) == 30);
      CHECK(scanned);
    }
  }

  TEST_CASE("torch_dist checkpoints keep the counters too: in common.pt's content_metadata") {
    cairn::memory_storage mem;
    const cairn::torch_dist_strategy torch_dist;
    cairn::checkpointer_options opt;
    opt.save.strategy = &torch_dist;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm, opt);
      model m(comm.rank(), 2, 30);
      CHECK(ckpt.save(m.sd, {.step = 30, .epoch = 2, .token = 7000, .tag = "warm"}).name ==
            "step00000030");
      REQUIRE(ckpt.finalize());
    });
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm, opt);
      model m(comm.rank(), 3, 0);
      auto r = ckpt.load_latest(m.sd).value();
      REQUIRE(r);
      // Only the step is in the name: the rest comes from the checkpoint's content metadata.
      CHECK(r->counters ==
            cairn::checkpoint_counters{.step = 30, .epoch = 2, .token = 7000, .tag = "warm"});
      CHECK(m.holds(comm.rank(), 3, 30));
    });
  }

  TEST_CASE("committed checkpoints of another template are not resumed from silently") {
    cairn::memory_storage mem;
    save_steps(mem, 2, {10});
    REQUIRE(mem.remove("latest"));
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm, {.name = "iter_{step:07}"});
      model m(comm.rank(), 2, 0);
      auto r = ckpt.load_latest(m.sd);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::not_found);
      CHECK(r.err().message.find("step00000010") != std::string::npos);
    });
  }

  TEST_CASE(
      "retention: keep the last N, every K steps and tagged ones, delete old incomplete ones") {
    cairn::memory_storage mem;
    const std::string partial = "data";
    REQUIRE(mem.put("step00000005/data.0.x.cairn", std::as_bytes(std::span(partial))));
    REQUIRE(mem.put("step00000099/data.0.x.cairn", std::as_bytes(std::span(partial))));
    REQUIRE(mem.put("notes/readme.txt", std::as_bytes(std::span(partial))));
    std::vector<std::vector<std::string>> deleted;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm, {.keep_last = 2, .keep_every = 30});
      for (std::int64_t s = 10; s <= 70; s += 10) {
        model m(comm.rank(), 2, s);
        std::vector<std::string> tags;
        if (s == 20) tags.push_back("best");
        auto r = ckpt.save(m.sd, {.step = s}, tags);
        REQUIRE(r.committed);
        CHECK(r.committed->retention_errors.empty());
        if (comm.rank() == 0) deleted.push_back(r.committed->deleted);
      }
    });
    // 70 and 60 the newest, 30 and 60 multiples of 30, 20 tagged "best".
    CHECK(checkpoint_names(mem) ==
          std::vector<std::string>{"step00000020", "step00000030", "step00000060", "step00000070"});
    REQUIRE(deleted.size() == 7);
    CHECK(deleted[0] == std::vector<std::string>{"step00000005"});  // a killed save's leftovers
    CHECK(deleted[1].empty());
    CHECK(deleted[2] == std::vector<std::string>{"step00000010"});  // at 30: 10 goes
    CHECK(deleted[4].empty());  // at 50: 40 is among the last 2, 30 a multiple, 20 tagged
    CHECK(deleted[5] == std::vector<std::string>{"step00000040"});  // at 60: 40 goes
    CHECK(deleted[6] == std::vector<std::string>{"step00000050"});  // at 70: 50 goes
    // An incomplete checkpoint newer than the last commit (it may be being written) and objects
    // not in a checkpoint stay; nothing of a deleted one does.
    CHECK(mem.exists("step00000099/data.0.x.cairn").value());
    CHECK(!mem.exists("step00000005/data.0.x.cairn").value());
    CHECK(mem.exists("notes/readme.txt").value());
    CHECK(mem.list("step00000010/").value().empty());
    CHECK(pointer(mem, "tags/best") == "step00000020\n");
    // Loading by tag.
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm);
      model m(comm.rank(), 2, 0);
      CHECK(ckpt.load(m.sd, "best").value().name == "step00000020");
      CHECK(m.holds(comm.rank(), 2, 20));
    });
    // What list_checkpoints tells.
    auto names = cairn::name_template::parse("step{step:08}").value();
    auto listed = cairn::list_checkpoints(mem, &names).value();
    // Every folder of the root is listed; only committed ones are checkpoints.
    REQUIRE(listed.size() == 6);
    CHECK(listed[0].name == "notes");
    CHECK(!listed[0].complete);
    CHECK(!listed[0].counters);
    CHECK(listed[1].name == "step00000020");
    CHECK(listed[1].complete);
    CHECK(listed[1].format == "cairn");
    CHECK(listed[1].tags == std::vector<std::string>{"best"});
    CHECK(listed[1].counters->step == 20);
    CHECK(!listed[1].latest);
    CHECK(listed[4].latest);
    CHECK(listed[4].bytes > 24 * 4 * 4);
    CHECK(listed[4].objects >= 3);  // data of 2 ranks, metadata, index files
    CHECK(listed[5].name == "step00000099");
    CHECK(!listed[5].complete);
    CHECK(listed[5].format.empty());
  }

  TEST_CASE("a failing deletion is reported, never fatal, and leaves an incomplete checkpoint") {
    cairn::memory_storage mem;
    failing_storage flaky(mem);
    save_steps(flaky, 2, {10, 20});
    flaky.fails = [](std::string_view op, std::string_view name) {
      return op == "remove" && name.starts_with("step00000010/data.");
    };
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(flaky, comm, {.keep_last = 1});
      model m(comm.rank(), 2, 30);
      auto r = ckpt.save(m.sd, {.step = 30});
      REQUIRE(r.committed);
      REQUIRE(r.committed->retention_errors.size() == 1);
      CHECK(r.committed->retention_errors[0].file.find("step00000010/data.") == 0);
      CHECK(r.committed->deleted == std::vector<std::string>{"step00000020"});
    });
    // Its metadata went first: what is left of step 10 is incomplete, never loaded.
    CHECK(checkpoint_names(mem) == std::vector<std::string>{"step00000030"});
    CHECK(!mem.list("step00000010/").value().empty());
    CHECK(latest_step(mem, 1) == 30);
  }

  TEST_CASE("async saves: latest moves when the next save or finalize commits") {
    cairn::memory_storage mem;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(mem, comm, {.keep_last = 2, .async = true});
      for (std::int64_t s : {10, 20, 30}) {
        model m(comm.rank(), 2, s);
        auto r = ckpt.save(m.sd, {.step = s});
        CHECK(!r.previous_failure);
        CHECK(ckpt.in_flight());
        if (s == 10) {
          CHECK(!r.committed);
        } else {
          REQUIRE(r.committed);
          CHECK(r.committed->name == "step000000" + std::to_string(s - 10));
        }
        comm.barrier();
        // latest names the save this call committed, or the one in flight once the background
        // thread has committed it (it may have by now): never one that has not committed.
        const std::string now = "step000000" + std::to_string(s);
        if (mem.exists("latest").value()) {
          const std::string named = pointer(mem);
          if (named == now + "\n")
            CHECK(mem.exists(now + "/metadata.json").value());
          else
            CHECK(named == "step000000" + std::to_string(s - 10) + "\n");
        } else {
          CHECK(s == 10);
        }
        comm.barrier();
        std::fill(m.w.begin(), m.w.end(), -1.0f);  // training goes on: the staged copy is saved
      }
      auto last = ckpt.finalize();
      REQUIRE(last);
      REQUIRE(*last);
      CHECK((*last)->name == "step00000030");
      CHECK((*last)->deleted == std::vector<std::string>{"step00000010"});
      CHECK(!ckpt.in_flight());
    });
    CHECK(pointer(mem) == "step00000030\n");
    CHECK(latest_step(mem, 4) == 30);
  }

  TEST_CASE("an async save commits, moves latest and prunes from the background thread") {
    cairn::memory_storage mem;
    std::vector<int> reported(2);
    std::atomic<int> latest_seen_before_next_call{0};
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer_options o{.keep_last = 1, .async = true};
      o.async_options.on_dropped = [&](const cairn::error&) {
        ++reported[static_cast<std::size_t>(comm.rank())];
      };
      cairn::checkpointer ckpt(mem, comm, o);
      CHECK(!ckpt.done());  // nothing in flight
      for (std::int64_t s : {10, 20}) {
        model m(comm.rank(), 2, s);
        ckpt.save(m.sd, {.step = s});
        // No call into cairn on this thread: the background thread commits and publishes.
        REQUIRE(cairn_test::poll_until([&] { return ckpt.done(); }));
        CHECK(ckpt.written());
        CHECK(ckpt.in_flight());  // settled, its result not yet collected
        comm.barrier();           // both ranks are done
        if (comm.rank() == 0 && pointer(mem) == "step000000" + std::to_string(s) + "\n")
          ++latest_seen_before_next_call;
        comm.barrier();
      }
      // step 20 is never finalized: committed in the background, it stays.
    });
    CHECK(latest_seen_before_next_call == 2);
    CHECK(reported == std::vector<int>{0, 0});
    CHECK(latest_step(mem, 2) == 20);
    CHECK(checkpoint_names(mem) == std::vector<std::string>{"step00000020"});  // keep_last = 1
  }

  TEST_CASE("without a duplicate communicator, an async save never finalized is reported") {
    cairn::memory_storage mem;
    std::vector<int> reported(2);
    cairn::run_ranks(2, [&](cairn::thread_communicator& thread_comm) {
      // A communicator of the user's without duplicate(): commits wait for the next call.
      std::vector<cairn_test::collective_use> log;
      cairn_test::counting_comm comm{thread_comm, &log};
      cairn::checkpointer_options o{.async = true};
      o.async_options.on_dropped = [&](const cairn::error& e) {
        CHECK(e.code == cairn::errc::incomplete_checkpoint);
        ++reported[static_cast<std::size_t>(comm.rank())];
      };
      cairn::checkpointer ckpt(mem, comm, o);
      CHECK(!ckpt.written());  // nothing in flight
      for (std::int64_t s : {10, 20}) {
        model m(comm.rank(), 2, s);
        ckpt.save(m.sd, {.step = s});
      }
      // step 20 is on storage, not yet committed
      CHECK(cairn_test::poll_until([&] { return ckpt.written(); }));
      CHECK(!ckpt.done());
    });  // step 20 is still in flight when the checkpointers go
    CHECK(reported == std::vector<int>{1, 1});
    CHECK(pointer(mem) == "step00000010\n");
    CHECK(latest_step(mem, 2) == 10);
  }

  TEST_CASE("a root opened from a URI, and file storage") {
    cairn_test::temp_dir dir;
    cairn::file_storage disk(dir.path);
    save_steps(disk, 2, {1, 2});
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(dir.path.string(), comm, {.keep_last = 1});
      model m(comm.rank(), 2, 0);
      auto r = ckpt.load_latest(m.sd).value();
      REQUIRE(r);
      CHECK(r->name == "step00000002");
      CHECK(m.holds(comm.rank(), 2, 2));
      model next(comm.rank(), 2, 3);
      CHECK(ckpt.save(next.sd, {.step = 3}).committed->deleted ==
            std::vector<std::string>{"step00000002", "step00000001"});
    });
    CHECK(checkpoint_names(disk) == std::vector<std::string>{"step00000003"});
    cairn::single_communicator one;
    CHECK_THROWS_AS(cairn::checkpointer(dir.path.string(), one, {.name = "fixed"}),
                    cairn::exception);
    CHECK_THROWS_AS(cairn::checkpointer(disk, one, {.latest = "a/b"}), cairn::exception);
  }
}

TEST_CASE("the checkpointer's messages round-trip and refuse truncation") {
  cairn_test::check_message(cairn::detail::resolved_message{
      "step000100", cairn::checkpoint_counters{100, 1, 2, 3, 4, "x"}});
  cairn_test::check_message(cairn::detail::proposed_name_message{"step000100", {"best", "eval"}});
  cairn_test::check_message(cairn::detail::published_message{
      {"step000010"}, {cairn::make_error(cairn::errc::io, "busy").with_file("step000009/x")}});
  cairn_test::check_message(cairn::detail::latest_message(std::pair("step000100", true)));
}
