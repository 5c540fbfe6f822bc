// cairn/plan/load_plan.hpp: load planning, pure functions. Which saved chunks fill which part
// of a target (`plan_copies`, which refuses chunks that overlap or leave gaps), and which block
// ranges to read for them, coalesced, straight into the target where possible (`plan_reads`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/plan/index.hpp"

namespace cairn::detail {

/// One copy from a saved chunk into a target piece: the elements of `region`.
struct copy_job {
  const chunk_record* chunk;
  box region;             ///< global coordinates, inside both the chunk and the target box
  std::byte* dst;         ///< start of the target piece's memory
  box dst_box;            ///< the target piece, row-major at `dst`
  std::size_t elem_size;  ///< of the saved chunk's dtype
  std::string key;
  /// `dst` is device memory: never read into directly; its runs are copied to the device
  /// through a staging window.
  bool on_device = false;
  /// The saved dtype and the target's: they differ when the load converts
  /// (`load_options::cast_floats`); such a job is never read into directly.
  dtype saved_type = dtype::u8, target_type = dtype::u8;
  /// Whether the copy converts between dtypes.
  bool casts() const noexcept { return saved_type != target_type; }
};

/// Adds the jobs that fill `dst_box` (row-major at `dst`) from the chunks of `rec`. Fails
/// unless the chunks it uses tile the part of `dst_box` inside the saved tensor exactly: two
/// chunks that overlap there, or a gap (a checkpoint saved with access-integrity validation off,
/// a chunk listed twice, a shifted offset) are errc::integrity errors naming the key and the
/// elements involved, so a load never leaves part of its target unwritten or filled twice.
CAIRN_INLINE result<void> plan_copies(const tensor_record& rec,
                                      const std::string& key,
                                      const box& dst_box,
                                      std::byte* dst,
                                      std::vector<copy_job>& jobs);

/// One read of a load: blocks [first_block, last_block] of a chunk, straight into target memory
/// (`direct`) or through a pooled buffer and then copied out by the jobs of group `group`.
struct read_op {
  const chunk_record* chunk;
  std::uint64_t first_block, last_block;
  std::byte* direct;  ///< read straight here when not null
  std::size_t group;  ///< index into read_plan::job_groups: the jobs this read serves
};

/// The reads of a load and the jobs they serve.
struct read_plan {
  std::vector<read_op> ops;
  std::vector<std::vector<std::size_t>> job_groups;  ///< per chunk: indices into the jobs
  std::uint64_t bytes_needed = 0;                    ///< bytes of the targets the jobs fill
};

/// A byte run of a chunk that one job needs: [lo, hi) of the chunk, going to `dst`.
struct chunk_run {
  std::uint64_t lo, hi;
  std::byte* dst;  ///< null when the target is device memory (no direct read)
};

/// Every run of `chunk` that the jobs `js` need, sorted by start.
CAIRN_INLINE std::vector<chunk_run> runs_of_chunk(const chunk_record& chunk,
                                                  const std::vector<copy_job>& jobs,
                                                  const std::vector<std::size_t>& js,
                                                  std::uint64_t& bytes_needed);

/// Answers "where can bytes [lo, hi) of a chunk be read straight into?": the target of the one
/// run that needs them all when no other run touches them, null otherwise.
class direct_targets {
 public:
  explicit direct_targets(const std::vector<chunk_run>& runs);
  std::byte* operator()(std::uint64_t lo, std::uint64_t hi) const;

 private:
  const std::vector<chunk_run>& runs_;
  std::vector<std::uint64_t> max_hi_;  // the largest hi of runs[0..i]
};

/// The blocks the runs touch, as sorted, merged intervals [first, last].
CAIRN_INLINE std::vector<std::pair<std::uint64_t, std::uint64_t>> touched_blocks(
    const std::vector<chunk_run>& runs, std::uint64_t block_size);

/// Plans the reads of one chunk's group of jobs: each touched interval in reads of at most
/// `blocks_per_io` blocks, straight into the target where one job needs every byte, otherwise
/// through buffers of `temp_blocks` blocks. The first and last blocks of an interval are often
/// shared with bytes no run needs: they get reads of their own, so that the blocks between can
/// go straight to the target.
CAIRN_INLINE void plan_chunk_reads(const chunk_record& chunk,
                                   const std::vector<chunk_run>& runs,
                                   std::size_t group,
                                   std::uint64_t block_size,
                                   std::uint64_t temp_blocks,
                                   std::uint64_t blocks_per_io,
                                   std::vector<read_op>& ops);

/// Plans the reads that fill every job: whole checksum blocks of `block_size`, coalesced per
/// chunk, at most `max_io_bytes` per read; reads that cannot go straight to their target use
/// buffers of `buffer_bytes`.
CAIRN_INLINE read_plan plan_reads(const std::vector<copy_job>& jobs,
                                  std::uint64_t block_size,
                                  std::uint64_t buffer_bytes,
                                  std::uint64_t max_io);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/load_plan-inl.hpp"
#endif
