// The checkpoint manager against s3rver: checkpoints under s3://bucket/run/<name>/, `latest` an
// object written after the commit (also for async saves), retention deleting objects, resume on
// another world size, and a stale pointer resolved by one listing (one rank lists, not all);
// the files each rank reports, progress reports, client state and objects.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cairn/manager/checkpointer.hpp"
#include "cairn/storage/s3.hpp"
#include "tests/system/s3/s3_ranks.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_s3_test;

TEST_CASE("checkpointer on S3: async saves, latest after commit, retention, resume, scan") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/run";
  cairn::s3_storage root(uri, options_for(srv.endpoint()));
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    cairn::checkpointer ckpt(root, comm, {.keep_last = 2, .async = true});
    for (int step : {1, 2, 3}) {
      rank_state rs(comm.rank(), 3, step % 2, true, std::to_string(step));
      auto r = ckpt.save(rs.sd, {.step = step});
      if (step > 1) {
        REQUIRE(r.committed);
        comm.barrier();
        // The pointer names the one just committed, never the one in flight.
        CHECK(cairn_test::read_text(root, "latest") == r.committed->name + "\n");
        comm.barrier();
      }
    }
    auto last = ckpt.finalize().value();
    REQUIRE(last);
    CHECK(last->deleted == std::vector<std::string>{"step00000001"});
  });
  CHECK(cairn_test::read_text(root, "latest") == "step00000003\n");
  CHECK(root.list("step00000001/").value().empty());
  CHECK(!root.list("step00000002/").value().empty());

  // Resume on 2 ranks, each with its own storage so its requests are counted apart.
  auto resume = [&](std::vector<cairn::s3_counters>& counts, std::string& name, bool& scanned) {
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::s3_storage mine(uri, options_for(srv.endpoint()));
      cairn::checkpointer ckpt(mine, comm);
      rank_state rs(comm.rank(), 2, 0, false);
      auto r = ckpt.load_latest(rs.sd).value();
      REQUIRE(r);
      CHECK(rs.holds(std::to_string(r->counters.step)));
      counts[comm.rank()] = mine.counters();
      if (comm.rank() == 0) {
        name = r->name;
        scanned = r->found_by_scan;
      }
    });
  };
  std::vector<cairn::s3_counters> counts(2);
  std::string name;
  bool scanned = true;
  resume(counts, name, scanned);
  CHECK(name == "step00000003");
  CHECK(!scanned);
  CHECK(counts[0].lists == 0);  // the pointer was enough
  CHECK(counts[1].lists == 0);

  // A stale pointer (a save killed before its commit): rank 0 lists once, rank 1 never.
  const std::string killed = "step00000004\n";
  REQUIRE(root.put("step00000004/data.0.0123456789ab.cairn", std::as_bytes(std::span(killed))));
  REQUIRE(root.put("latest", std::as_bytes(std::span(killed))));
  resume(counts, name, scanned);
  CHECK(name == "step00000003");
  CHECK(scanned);
  CHECK(counts[0].lists >= 1);
  CHECK(counts[1].lists == 0);
}

TEST_CASE("checkpointer on S3: files reported, progress, client state and objects") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/run";
  cairn::s3_storage root(uri, options_for(srv.endpoint()));
  std::vector<std::vector<std::string>> files(3);
  std::vector<std::uint64_t> written(3), write_ends(3);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    cairn::checkpointer_options opt;
    opt.save.progress = [&, r](const cairn::progress_report& p) {
      if (p.stage == "write" && p.done == p.total) write_ends[r] = p.total;
    };
    cairn::checkpointer ckpt(root, comm, opt);
    rank_state rs(comm.rank(), 3, 0, true, "s3");
    rs.sd.add("seed", std::int64_t{42});
    const auto mine = static_cast<unsigned char>(comm.rank());
    rs.sd.add("rng", cairn::per_rank("rng", cairn::bytes{std::byte{mine}}, comm.rank(), 3));
    auto saved = ckpt.save(rs.sd, {.step = 5});
    REQUIRE(saved.committed);
    files[r] = saved.committed->stats.files;
    written[r] = saved.committed->stats.bytes_written;
  });
  // The objects reported are the checkpoint's, and each rank's write reports ended at its share.
  std::set<std::string> reported;
  for (std::size_t r = 0; r < 3; ++r) {
    reported.insert(files[r].begin(), files[r].end());
    CHECK(write_ends[r] == written[r]);
  }
  std::set<std::string> stored;
  for (const auto& n : root.list("step00000005/").value())
    stored.insert(n.substr(std::string("step00000005/").size()));
  CHECK(reported == stored);
  // Resume on 2 ranks, model only: the seed and every rank's RNG come back as client state.
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::s3_storage mine(uri, options_for(srv.endpoint()));
    cairn::checkpointer ckpt(mine, comm);
    rank_state rs(comm.rank(), 2, 0, false);
    std::map<std::string, cairn::common_value> client;
    std::map<std::string, cairn::bytes> objects;
    std::uint64_t read_end = 0;
    cairn::load_options lo;
    lo.client_state = &client;
    lo.client_objects = &objects;
    lo.progress = [&](const cairn::progress_report& p) {
      if (p.stage == "read" && p.done == p.total) read_end = p.total;
    };
    auto r = ckpt.load_latest(rs.sd, lo).value();
    REQUIRE(r);
    CHECK(rs.holds("s3"));
    CHECK(read_end == r->stats.bytes_read - 3);  // the three RNG objects are read whole
    REQUIRE(client.count("seed"));
    CHECK(client.at("seed").as<std::int64_t>() == 42);
    REQUIRE(objects.size() == 3);
    CHECK(objects.at("rng/shard_2_3") == cairn::bytes{std::byte{2}});
  });
}
