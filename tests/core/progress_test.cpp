// Progress callbacks (core/progress.hpp): every stage of save, load, verify, convert, diff and
// cached_storage downloads reports its start at 0, never goes back, ends at its total (the bytes
// the stage's statistics count), and calls one at a time; a stage with nothing to do on a rank
// reports nothing.
#include "cairn/core/progress.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/cached.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/test_util.hpp"

namespace {

/// Records the reports of one rank and checks them as they come: one call at a time, each
/// stage (and downloaded object) starting at 0, never going back, never past its total, the
/// total fixed.
class recorder {
 public:
  /// The callback to hand to an operation.
  cairn::progress_callback callback() {
    return [this](const cairn::progress_report& p) {
      if (in_call_.exchange(true)) overlapped_ = true;
      {
        std::lock_guard lock(mu_);
        const std::string key = std::string(p.stage) + "|" + std::string(p.object);
        auto it = last_.find(key);
        if (it == last_.end()) {
          if (p.done != 0) bad_.push_back(key + ": first report not at 0");
          order_.push_back(key);
        } else {
          if (p.done < it->second.done) bad_.push_back(key + ": went back");
          if (p.total != it->second.total) bad_.push_back(key + ": total changed");
        }
        if (p.done > p.total) bad_.push_back(key + ": past the total");
        if (p.total == 0) bad_.push_back(key + ": total 0");
        last_[key] = {p.done, p.total};
        ++calls_;
      }
      in_call_ = false;
    };
  }
  struct last_report {
    std::uint64_t done = 0, total = 0;
  };
  /// The last report of `stage` (of `object`, for downloads); nullopt when none came.
  std::optional<last_report> last(const std::string& stage, const std::string& object = "") const {
    std::lock_guard lock(mu_);
    auto it = last_.find(stage + "|" + object);
    if (it == last_.end()) return std::nullopt;
    return it->second;
  }
  /// Whether `stage` (of `object`) ended: its last report has done == total.
  bool finished(const std::string& stage, const std::string& object = "") const {
    auto l = last(stage, object);
    return l && l->done == l->total;
  }
  /// What went wrong ("" when nothing).
  std::string problems() const {
    std::lock_guard lock(mu_);
    std::string s = overlapped_ ? "two calls at once; " : "";
    for (const auto& b : bad_) s += b + "; ";
    return s;
  }
  /// The stages reported, in the order they first reported.
  std::vector<std::string> stages() const {
    std::lock_guard lock(mu_);
    return order_;
  }
  std::size_t calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> in_call_{false};
  bool overlapped_ = false;
  std::map<std::string, last_report> last_;
  std::vector<std::string> order_, bad_;
  std::size_t calls_ = 0;
};

/// A [rows, 64] f32 weight in row blocks and a replicated i64 tensor of `ids` elements.
struct model {
  std::vector<float> w;
  std::vector<std::int64_t> ids;
  cairn::state_dict sd;
  model(int rank, int world, float seed, std::int64_t rows = 256, std::int64_t n_ids = 4096) {
    const std::int64_t n = rows / world;
    w.resize(static_cast<std::size_t>(n * 64));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = seed + static_cast<float>(i % 977);
    ids.assign(static_cast<std::size_t>(n_ids), 7);
    sd.add("w", cairn::block("w", std::span(w), {n, 64}, {rows, 64}, {rank * n, 0}));
    sd.add("ids", cairn::replicated("ids", std::span(ids), {n_ids}, rank));
  }
};

}  // namespace

TEST_CASE(
    "progress_meter: one call at a time from many threads, about 1000 reports, ends at total") {
  recorder rec;
  const cairn::progress_callback cb = rec.callback();
  const std::uint64_t total = 8 * 100000;
  {
    cairn::detail::progress_meter meter(&cb, "write", total);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < 100000; ++i) meter.add(1);
      });
    for (auto& t : threads) t.join();
    meter.finish();  // already at the total: no second end
  }
  CHECK(rec.problems() == "");
  CHECK(rec.finished("write"));
  CHECK(rec.calls() >= 1000);
  CHECK(rec.calls() <= 1002);
  // A sum past the total is reported as the total; finish() ends a stage that fell short.
  recorder over;
  const cairn::progress_callback cb2 = over.callback();
  {
    cairn::detail::progress_meter meter(&cb2, "read", 10);
    meter.add(25);
  }
  CHECK(over.problems() == "");
  CHECK(over.finished("read"));
  recorder shortfall;
  const cairn::progress_callback cb3 = shortfall.callback();
  {
    cairn::detail::progress_meter meter(&cb3, "verify", 100000);
    meter.add(10);
    CHECK(!shortfall.finished("verify"));
    meter.finish();
  }
  CHECK(shortfall.finished("verify"));
  // Nothing to do, or no callback: no reports and no crash.
  recorder none;
  const cairn::progress_callback cb4 = none.callback();
  cairn::detail::progress_meter empty(&cb4, "write", 0);
  empty.add(5);
  empty.finish();
  CHECK(none.calls() == 0);
  cairn::detail::progress_meter unset(nullptr, "write", 10);
  unset.add(5);
  const cairn::progress_callback blank;
  cairn::detail::progress_meter blank_meter(&blank, "write", 10);
  blank_meter.add(5);
}

TEST_CASE("save and load report progress in every layout, sync and async") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
  struct layout {
    const char* name;
    const cairn::save_strategy* strategy;
    bool index_files;
    int zstd;
  };
  const layout layouts[] = {{"native v4", nullptr, true, 0},
                            {"native v3", nullptr, false, 0},
                            {"native zstd", nullptr, true, 3},
                            {"torch_dist", &torch_dist, true, 0},
                            {"one_file", &one_file, true, 0}};
  for (const layout& l : layouts) {
    for (bool async : {false, true}) {
      CAPTURE(l.name);
      CAPTURE(async);
      cairn::memory_storage mem;
      std::vector<recorder> saves(3), loads(2);
      std::vector<cairn::save_stats> save_stats(3);
      std::vector<cairn::load_stats> load_stats(2);
      cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        model m(comm.rank(), 3, 1.0f, 258);
        cairn::save_options so;
        so.strategy = l.strategy;
        so.index_files = l.index_files;
        so.zstd_level = l.zstd;
        so.block_size = 4096;
        so.progress = saves[r].callback();
        if (async) {
          cairn::async_saver saver;
          saver.save(m.sd, mem, comm, so).value();
          save_stats[r] = saver.finalize().value();
        } else {
          save_stats[r] = cairn::save(m.sd, mem, comm, so);
        }
      });
      std::uint64_t written = 0, assembled = 0;
      for (std::size_t r = 0; r < 3; ++r) {
        CAPTURE(r);
        CHECK(saves[r].problems() == "");
        auto w = saves[r].last("write");
        if (save_stats[r].bytes_written == 0) {
          CHECK(!w);  // nothing to write on this rank: nothing reported
        } else {
          REQUIRE(w);
          CHECK(w->done == w->total);
          CHECK(w->total == save_stats[r].bytes_written);
          written += w->total;
        }
        if (auto a = saves[r].last("assemble")) {
          CHECK(a->done == a->total);
          assembled += a->total;
        }
      }
      const std::uint64_t tensor_bytes = 258 * 64 * 4 + 4096 * 8;
      CHECK(written == tensor_bytes);  // replicas written once
      CHECK(assembled == (l.strategy == &one_file ? tensor_bytes : 0));
      // Load on 2 ranks: each rank's reads.
      cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        model m(comm.rank(), 2, 0.0f, 258);
        cairn::load_options lo;
        lo.progress = loads[r].callback();
        load_stats[r] = cairn::load(m.sd, mem, comm, lo);
        if (r == 0) CHECK(m.w[5] == 1.0f + 5.0f);
      });
      for (std::size_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        CHECK(loads[r].problems() == "");
        auto rd = loads[r].last("read");
        REQUIRE(rd);
        CHECK(rd->done == rd->total);
        CHECK(rd->total == load_stats[r].bytes_read);  // no objects: tensors only
        CHECK(loads[r].stages() == std::vector<std::string>{"read|"});
      }
    }
  }
}

TEST_CASE("the checkpointer's async saves report progress from the background thread") {
  cairn::memory_storage root;
  std::vector<recorder> recs(2);
  std::vector<std::thread::id> callers(2), mains(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    mains[r] = std::this_thread::get_id();
    cairn::checkpointer_options opt;
    opt.async = true;
    auto inner = recs[r].callback();
    opt.save.progress = [&, r, inner](const cairn::progress_report& p) {
      callers[r] = std::this_thread::get_id();
      inner(p);
    };
    cairn::checkpointer ckpt(root, comm, opt);
    model m(comm.rank(), 2, 3.0f);
    ckpt.save(m.sd, {.step = 10});
    REQUIRE(ckpt.finalize().value());
    recorder load_rec;
    cairn::load_options lo;
    lo.progress = load_rec.callback();
    model back(comm.rank(), 2, 0.0f);
    auto loaded = ckpt.load_latest(back.sd, lo).value();
    REQUIRE(loaded);
    CHECK(load_rec.finished("read"));
    CHECK(load_rec.problems() == "");
    CHECK(back.w == m.w);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(recs[r].problems() == "");
    CHECK(recs[r].finished("write"));
    CHECK(callers[r] != mains[r]);
  }
}

TEST_CASE("verify, load_tensors, convert, diff and cached downloads report progress") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt");
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    model m(comm.rank(), 2, 2.0f);
    cairn::save_options so;
    so.block_size = 4096;
    cairn::save(m.sd, ck, comm, so);
  });
  const std::uint64_t tensor_bytes = 256 * 64 * 4 + 4096 * 8;

  recorder v;
  auto report = cairn::verify_any(ck, 2, v.callback()).value();
  CHECK(report.problems.empty());
  CHECK(v.problems() == "");
  REQUIRE(v.last("verify"));
  CHECK(v.finished("verify"));
  CHECK(v.last("verify")->total == tensor_bytes);

  recorder lt;
  auto tensors = cairn::load_tensors(ck, {"w"}, 2, lt.callback()).value();
  CHECK(tensors.at("w").data.size() == 256 * 64 * 4);
  CHECK(lt.finished("read"));
  CHECK(lt.last("read")->total == 256 * 64 * 4);

  // convert to torch_dist, then verify that (no checksums: its bytes are read all the same).
  cairn::file_storage dist(d.path / "dist");
  recorder cv;
  auto src = cairn::convert::open_source(ck).value();
  cairn::convert::convert_options copt;
  copt.format = cairn::convert::output_format::torch_dist;
  copt.slab_bytes = 8192;
  copt.progress = cv.callback();
  cairn::convert::convert(*src, dist, copt).value();
  CHECK(cv.problems() == "");
  CHECK(cv.finished("convert"));
  CHECK(cv.last("convert")->total == tensor_bytes);
  CHECK(cv.calls() > 10);  // after each slab
  recorder vd;
  auto dist_report = cairn::verify_any(dist, 2, vd.callback()).value();
  CHECK(dist_report.format == "torch_dist");
  CHECK(vd.finished("verify"));
  CHECK(vd.last("verify")->total == tensor_bytes);

  recorder df;
  auto dist_src = cairn::convert::open_source(dist).value();
  auto same = cairn::convert::diff(*src, *dist_src, 4096, df.callback()).value();
  CHECK(same.same());
  CHECK(df.finished("diff"));
  CHECK(df.last("diff")->total == same.bytes_compared);

  // A load through a cached_storage: one download per object, each reported to its end.
  cairn::cached_storage cached(ck, d.path / "cache", 4096);
  recorder dl;
  cached.set_progress(dl.callback());
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    model m(comm.rank(), 2, 0.0f);
    cairn::load(m.sd, cached, comm);
    CHECK(m.w[3] == 2.0f + 3.0f);
  });
  CHECK(dl.problems() == "");
  std::size_t downloads = 0;
  for (const auto& key : dl.stages()) {
    CAPTURE(key);
    REQUIRE(key.starts_with("download|"));
    const std::string object = key.substr(9);
    CHECK(dl.finished("download", object));
    CHECK(dl.last("download", object)->total == ck.size(object).value());
    ++downloads;
  }
  CHECK(downloads == cached.downloads());
  CHECK(downloads >= 2);
}
