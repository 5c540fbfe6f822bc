// Fault tests: a proxy answering 503 SlowDown to a fraction of requests (the save still
// succeeds), and the server killed mid-save (every rank gets a clear error within the time
// bound; the previous checkpoint still loads once the server is back).
#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <sstream>

#include "cairn/storage/s3.hpp"
#include "tests/system/s3/s3_ranks.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_s3_test;

TEST_CASE("a server answering 503 SlowDown to 25% of requests: save and load still succeed") {
  if (skipped()) return;
  s3rver srv;
  node_server proxy({script("slowdown_proxy.cjs"), std::to_string(srv.port), "0.25", "7"});
  cairn::s3_options o = options_for(proxy.endpoint());
  o.part_size = 256 << 10;
  const std::string uri = "s3://" + srv.bucket + "/slow";
  cairn::s3_storage st(uri, o);
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    rank_state rs(comm.rank(), 4, 0, true);
    cairn::save(rs.sd, st, comm);
  });
  auto c = st.counters();
  MESSAGE("save through the proxy: " << c.requests << " requests, " << c.retries << " retries");
  CHECK(c.retries > 0);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    rank_state rs(comm.rank(), 3, 1, false);
    cairn::load(rs.sd, st, comm);
    CHECK(rs.holds());
  });
  std::string stats = http_get(proxy.endpoint() + "/__stats");
  MESSAGE("proxy: " << stats);
  CHECK(stats.find("\"slowdowns\":0") == std::string::npos);
}

TEST_CASE("the server killed mid-save: every rank fails in time, the previous checkpoint loads") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/crash";
  {
    cairn::s3_storage st(uri, options_for(srv.endpoint()));
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      rank_state rs(comm.rank(), 4, 0, true, "old");
      cairn::save(rs.sd, st, comm);
    });
  }
  // The second save (overwrite) kills the server at its first data upload.
  const auto deadline = std::chrono::seconds(3);
  cairn::s3_options o = options_for(srv.endpoint());
  o.deadline = deadline;
  o.part_size = 256 << 10;
  std::once_flag killed;
  o.on_request = [&](std::string_view method, std::string_view key, std::string_view) {
    if (method == "PUT" && key.find("/data.") != std::string_view::npos)
      std::call_once(killed, [&] { srv.kill(); });
  };
  cairn::s3_storage st(uri, o);
  std::mutex mu;
  std::vector<std::string> errors(4);
  std::vector<double> seconds(4);
  cairn::save_options so;
  so.overwrite = true;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    rank_state rs(comm.rank(), 4, 0, true, "new");
    auto t0 = std::chrono::steady_clock::now();
    auto r = cairn::try_save(rs.sd, st, comm, so);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(mu);
    seconds[comm.rank()] = secs;
    errors[comm.rank()] = r ? std::string() : r.err().describe();
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    MESSAGE("rank " << r << " after " << seconds[r] << " s: " << errors[r]);
    CHECK(!errors[r].empty());
    CHECK(errors[r].find("s3://" + srv.bucket + "/crash/") != std::string::npos);
    // One operation's deadline, plus cleanup that fails fast once the server is known down.
    CHECK(seconds[r] < 2.5 * std::chrono::duration<double>(deadline).count());
  }
  // At least one rank names the S3 failure itself (the others may report it came from there).
  bool named = false;
  for (const auto& e : errors) named |= e.find("gave up after") != std::string::npos;
  CHECK(named);

  REQUIRE(srv.start());
  cairn::s3_storage fresh(uri, options_for(srv.endpoint()));
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    rank_state rs(comm.rank(), 2, 1, false);
    cairn::load(rs.sd, fresh, comm);
    CHECK(rs.holds("old"));
  });
}
