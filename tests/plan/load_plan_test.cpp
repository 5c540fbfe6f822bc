// The load planner (plan_copies, plan_reads), tested directly: pure functions over descriptions
// and boxes, no storage, no communicator.
#include "cairn/plan/load_plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "cairn/plan/save_plan.hpp"

namespace {

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

}  // namespace

TEST_CASE("plan_copies and plan_reads: a reshard reads whole blocks, straight in where it can") {
  // A [8, 4] f32 tensor saved as two row blocks (128 bytes each, 16-byte blocks); the target
  // is rows 2-5 (crossing both chunks).
  cairn::tensor_record rec;
  rec.type = cairn::dtype::f32;
  rec.global_shape = {8, 4};
  rec.chunks.push_back({box{{0, 0}, {4, 4}}, cairn::extent{0, 0, 64, {}}, {}});
  rec.chunks.push_back({box{{4, 0}, {4, 4}}, cairn::extent{0, 64, 64, {}}, {}});
  std::vector<std::byte> target(4 * 4 * 4);
  std::vector<cairn::detail::copy_job> jobs;
  REQUIRE(cairn::detail::plan_copies(rec, "w", box{{2, 0}, {4, 4}}, target.data(), jobs));
  REQUIRE(jobs.size() == 2);
  cairn::detail::read_plan plan = cairn::detail::plan_reads(jobs, 16, 1 << 20, 64 << 20);
  CHECK(plan.bytes_needed == target.size());
  std::uint64_t blocks = 0;
  for (const auto& op : plan.ops) {
    blocks += op.last_block - op.first_block + 1;
    CHECK(op.direct != nullptr);  // rows are whole blocks: every read goes straight in
  }
  CHECK(blocks == 4);  // rows 2-3 of chunk 0 and rows 4-5 of chunk 1, one 16-byte block each
  // Columns 1-2 only: blocks are shared with bytes nobody needs, so reads go through buffers.
  jobs.clear();
  std::vector<std::byte> cols(8 * 2 * 4);
  REQUIRE(cairn::detail::plan_copies(rec, "w", box{{0, 1}, {8, 2}}, cols.data(), jobs));
  plan = cairn::detail::plan_reads(jobs, 16, 1 << 20, 64 << 20);
  CHECK(plan.bytes_needed == cols.size());
  for (const auto& op : plan.ops) CHECK(op.direct == nullptr);
}

TEST_CASE("plan_copies: overlapping or missing chunks are refused before any read") {
  cairn::tensor_record rec;
  rec.type = cairn::dtype::f32;
  rec.global_shape = {4};
  rec.chunks.push_back({box{{0}, {2}}, cairn::extent{}, {}});
  rec.chunks.push_back({box{{1}, {2}}, cairn::extent{}, {}});  // overlaps, and x[3] is missing
  std::vector<cairn::detail::copy_job> jobs;
  auto r = cairn::detail::plan_copies(rec, "x", box{{0}, {4}}, nullptr, jobs);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "x");
  CHECK(jobs.empty());
}

TEST_CASE("plan_copies: a piece that meets no chunk is a gap naming the missing elements") {
  // x[0:2] listed twice, x[2:4] nowhere: a rank loading x[2:4] meets no chunk at all (this
  // formatted the names of two chunks of an empty job list and crashed).
  cairn::tensor_record rec;
  rec.type = cairn::dtype::f32;
  rec.global_shape = {4};
  rec.chunks.push_back({box{{0}, {2}}, cairn::extent{}, {}});
  rec.chunks.push_back({box{{0}, {2}}, cairn::extent{}, {}});
  for (const box& piece : {box{{2}, {2}}, box{{3}, {1}}, box{{1}, {2}}, box{{0}, {2}}}) {
    CAPTURE(piece.str());
    std::vector<cairn::detail::copy_job> jobs(1);  // a job of an earlier tensor stays
    auto r = cairn::detail::plan_copies(rec, "x", piece, nullptr, jobs);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::integrity);
    CHECK(r.err().key == "x");
    CHECK(jobs.size() == 1);
    if (piece.offset[0] >= 2) {
      CHECK(r.err().message.find("no chunk of the checkpoint holds " + piece.str()) !=
            std::string::npos);
    } else {  // both copies of x[0:2] meet the piece: an overlap, named by its two chunks
      CHECK(r.err().message.find("[0:2] and [0:2] both hold " +
                                 box{{piece.offset[0]}, {2 - piece.offset[0]}}.str()) !=
            std::string::npos);
    }
  }
  // A tensor with no chunks at all, and a scalar with none.
  rec.chunks.clear();
  std::vector<cairn::detail::copy_job> jobs;
  auto r = cairn::detail::plan_copies(rec, "x", box{{1}, {2}}, nullptr, jobs);
  REQUIRE(!r);
  CHECK(r.err().message.find("holds [1:3]") != std::string::npos);
  rec.global_shape = {};
  r = cairn::detail::plan_copies(rec, "x", box{}, nullptr, jobs);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(jobs.empty());
}
