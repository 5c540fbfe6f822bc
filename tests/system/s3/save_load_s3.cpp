// Save on 4 thread ranks through s3rver, load on 2 and 3 (resharding), counting the bytes each
// rank GETs: they are exactly what load_stats.bytes_read reports, and only what the rank needs.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cairn/storage/s3.hpp"
#include "tests/system/s3/s3_ranks.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_s3_test;

namespace {

/// The saved chunks that rank `rank` of `world` meets, over every tensor, when each tensor is
/// split along `axis` as rank_state splits it.
std::uint64_t chunks_met(const cairn::checkpoint_metadata& m, int world, int rank, int axis) {
  rank_state rs(rank, world, axis, false);
  std::uint64_t met = 0;
  const auto sp = specs();
  for (std::size_t i = 0; i < sp.size(); ++i)
    for (const auto& c : m.tensors.at(sp[i].key).chunks)
      if (cairn::intersect(c.region, rs.blocks[i])) ++met;
  return met;
}

}  // namespace

TEST_CASE("save on 4 ranks, load on 2 and 3, each rank GETs only what it reads") {
  if (skipped()) return;
  s3rver srv;
  const std::string uri = "s3://" + srv.bucket + "/ckpt/step-100";
  cairn::save_options so;
  // 4 KiB blocks: small enough that whole-block reads show in the counts, large enough that a
  // load takes a few hundred GETs, not thousands.
  so.block_size = 4096;
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
  cairn::checkpoint_metadata saved;
  {
    cairn::s3_storage st(uri, options_for(srv.endpoint()));
    saved = cairn::read_metadata(st).value();
  }

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
      std::uint64_t all_read = 0;
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(ok[r]);
        // Rank 0 also reads metadata.json and broadcasts it; every other GET is counted in
        // load_stats: data in bytes_read, the index pages of the rank's pieces in
        // index_bytes_read.
        std::uint64_t extra = r == 0 ? metadata_size : 0;
        CHECK(stats[r].index_bytes_read > 0);
        CHECK(counts[r].bytes_got == stats[r].bytes_read + stats[r].index_bytes_read + extra);
        CHECK(stats[r].bytes_read >= stats[r].bytes_needed);
        // Row blocks (axis 0) are contiguous rows of every chunk they meet (format version 4
        // cuts each saved block into slabs): whole checksum blocks cost at most 2 partial
        // blocks per chunk met. Column blocks need a piece of every row: whole blocks around
        // each.
        if (axis == 0)
          CHECK(stats[r].bytes_read <=
                stats[r].bytes_needed + 2 * so.block_size * chunks_met(saved, world, r, axis));
        else
          CHECK(stats[r].bytes_read < total_data * 4 / 5);
        all_read += stats[r].bytes_read;
        MESSAGE("world " << world << " axis " << axis << " rank " << r << ": GETs "
                         << counts[r].gets << ", bytes " << counts[r].bytes_got << " (needed "
                         << stats[r].bytes_needed << ")");
      }
      if (axis == 0) CHECK(all_read < total_data + total_data / 20);  // about once in all
    }
  }
}

TEST_CASE("the cairn CLI inspects and verifies a checkpoint at s3://bucket/prefix") {
  if (skipped()) return;
  const char* cli = std::getenv("CAIRN_CLI");  // set by ctest when the tool is built
  if (cli == nullptr) {
    std::printf("SKIP: the cairn tool is not built here (CAIRN_CLI unset)\n");
    return;
  }
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
  std::string inspect = run(env + "'" + cli + "' inspect " + uri + " --json");
  CHECK(inspect.find("\"world_size\":2") != std::string::npos);
  CHECK(inspect.find("\"emb\"") != std::string::npos);
  std::string verify = run(env + "'" + cli + "' verify " + uri);
  CHECK(verify.find("all checksums match") != std::string::npos);
}
