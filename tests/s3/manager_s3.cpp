// The checkpoint manager against s3rver: checkpoints under s3://bucket/run/<name>/, `latest` an
// object written after the commit (also for async saves), retention deleting objects, resume on
// another world size, and a stale pointer resolved by one listing (one rank lists, not all).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/manager/checkpointer.hpp"
#include "cairn/storage/s3.hpp"
#include "tests/s3/s3_ranks.hpp"
#include "tests/s3/s3_server.hpp"

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
