// Save on 4 thread ranks through s3rver, load on 2 and 3 (resharding), counting the bytes each
// rank GETs: they are exactly what load_stats.bytes_read reports, and only what the rank needs.
#include <doctest/doctest.h>

#include <mutex>

#include "cairn/storage/s3.hpp"
#include "tests/system/s3/s3_ranks.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_s3_test;

TEST_CASE("save on 4 ranks, load on 2 and 3, each rank GETs only what it reads") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/ckpt/step-100";
  cairn::save_options so;
  so.block_size = 512;
  cairn::s3_counters save_counts;
  {
    cairn::s3_options o = options_for(srv.endpoint());
    o.part_size = 256 << 10;  // each rank's ≈ 540 KiB data file goes up in parts
    cairn::s3_storage st(uri, o);
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      rank_state rs(comm.rank(), 4, 0, true);
      cairn::save(rs.sd, st, comm, so);
    });
    save_counts = st.counters();
    CHECK(st.exists("metadata.json").value());
  }
  MESSAGE("save: " << save_counts.puts << " PUTs, " << save_counts.parts << " parts, "
                   << save_counts.bytes_put << " bytes");
  CHECK(save_counts.parts > 0);  // the 2 MiB tensor's data files are multipart uploads

  std::uint64_t total_data = 0;
  for (const auto& s : specs())
    total_data += static_cast<std::uint64_t>(cairn::numel(s.global)) * cairn::dtype_size(s.type);
  for (int world : {2, 3}) {
    for (int axis : {0, 1}) {
      CAPTURE(world);
      CAPTURE(axis);
      std::vector<cairn::load_stats> stats(static_cast<std::size_t>(world));
      std::vector<cairn::s3_counters> counts(static_cast<std::size_t>(world));
      std::vector<int> ok(static_cast<std::size_t>(world), 0);
      std::uint64_t metadata_size = 0;
      cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
        // One storage per rank, so that each rank's GETs are counted apart.
        cairn::s3_options o = options_for(srv.endpoint());
        o.rank = comm.rank();
        cairn::s3_storage st(uri, o);
        rank_state rs(comm.rank(), world, axis, false);
        stats[comm.rank()] = cairn::load(rs.sd, st, comm);
        counts[comm.rank()] = st.counters();
        ok[comm.rank()] = rs.holds();
        if (comm.rank() == 0) metadata_size = st.size("metadata.json").value();
      });
      std::uint64_t all_got = 0;
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(ok[r]);
        // Rank 0 also reads metadata.json and broadcasts it; every other GET is counted in
        // load_stats.bytes_read.
        std::uint64_t extra = r == 0 ? metadata_size : 0;
        CHECK(counts[r].bytes_got == stats[r].bytes_read + extra);
        CHECK(stats[r].bytes_read >= stats[r].bytes_needed);
        // Row blocks (axis 0) are contiguous: whole checksum blocks cost at most 2 per tensor
        // and saved file. Column blocks need a piece of every row: whole blocks around each.
        if (axis == 0)
          CHECK(stats[r].bytes_read <= stats[r].bytes_needed + 3 * 4 * 2 * so.block_size);
        else
          CHECK(stats[r].bytes_read < total_data * 4 / 5);
        all_got += counts[r].bytes_got;
        MESSAGE("world " << world << " axis " << axis << " rank " << r << ": GETs "
                         << counts[r].gets << ", bytes " << counts[r].bytes_got << " (needed "
                         << stats[r].bytes_needed << ")");
      }
      if (axis == 0) CHECK(all_got < total_data + metadata_size + total_data / 20);
    }
  }
}

#ifdef CAIRN_CLI_PATH
TEST_CASE("the cairn CLI inspects and verifies a checkpoint at s3://bucket/prefix") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/cli/ckpt";
  cairn::s3_storage st(uri, options_for(srv.endpoint()));
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    rank_state rs(comm.rank(), 2, 0, true);
    cairn::save(rs.sd, st, comm);
  });
  const std::string env =
      "AWS_ENDPOINT_URL=" + srv.endpoint() +
      " AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 ";
  std::string inspect = run(env + "'" CAIRN_CLI_PATH "' inspect " + uri + " --json");
  CHECK(inspect.find("\"world_size\":2") != std::string::npos);
  CHECK(inspect.find("\"emb\"") != std::string::npos);
  std::string verify = run(env + "'" CAIRN_CLI_PATH "' verify " + uri);
  CHECK(verify.find("all checksums match") != std::string::npos);
}
#endif
