// cairn/format/native/box_reader.hpp: reading boxes of saved tensors, the engine under `load`,
// `load_tensors` and `convert::native_source`: copy jobs (plan/load_plan.hpp) become coalesced
// reads of whole checksum blocks, verified, straight into target memory where one chunk maps
// onto its target, else through pooled buffers. It serves every format whose catalog is cairn
// metadata (native, and DCP and safetensors as their readers describe them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/load_plan.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// What a read of boxes cost: the bytes its targets needed and the bytes it read (whole
/// blocks, so at least as many).
struct read_counts {
  std::uint64_t bytes_needed = 0;
  std::uint64_t bytes_read = 0;
};

/// One box of one saved tensor, to be read row-major into `out` (exactly the box's volume
/// times the saved dtype's size bytes).
struct box_request {
  std::string key;
  box region;
  std::span<std::byte> out;
};

/// Reads `boxes` from the checkpoint `m` on `st`: each box must lie inside its tensor (else
/// errc::invalid_argument, as is an `out` of the wrong size) and be tiled exactly by the
/// chunks it meets (else errc::integrity), errors naming the key; every block read
/// is verified against its checksum (when the format has them). `threads` reads at once;
/// `pool`'s buffers (a private pool when null) carry reads that cannot go straight to a target.
CAIRN_INLINE result<read_counts> read_boxes(storage_ref st,
                                            const checkpoint_metadata& m,
                                            const std::vector<box_request>& boxes,
                                            int threads,
                                            buffer_pool* pool = nullptr,
                                            const progress_callback* progress = nullptr);

namespace detail {

/// The bytes one planned read reads: its whole blocks, the last one cut at the chunk's end.
CAIRN_INLINE std::uint64_t read_length(const read_op& op, std::uint64_t block_size);

/// Copies one run of a converting job (`job.casts()`): `in`, the saved elements starting `at`
/// bytes into the run, converted into the target run at `run_dst` (host memory, or device
/// memory through `device` by way of `converted`). A run whose bytes do not hold whole elements
/// (a block size that is not a multiple of the element size) is an error naming the key.
CAIRN_INLINE result<void> cast_run(const copy_job& job,
                                   std::span<const std::byte> in,
                                   std::uint64_t at,
                                   std::byte* run_dst,
                                   std::vector<std::byte>& converted,
                                   std::optional<cuda::window_mover>& device);

/// Runs one planned read: whole blocks, verified, straight into the target or through a pooled
/// buffer that the read's jobs then copy out of (through `window`, one slot, for jobs whose
/// target is device memory).
CAIRN_INLINE result<void> run_read(storage_ref st,
                                   const checkpoint_metadata& m,
                                   const std::vector<copy_job>& jobs,
                                   const read_op& op,
                                   const std::vector<std::size_t>& group,
                                   buffer_pool& pool,
                                   std::atomic<std::uint64_t>& bytes_read,
                                   progress_meter& progress,
                                   cuda::staging_window* window = nullptr);

/// Reads what the jobs need, whole checksum blocks only, verifies them, and copies into
/// place. A chunk that maps one-to-one onto its target is read straight into target memory.
/// Reads that cannot go straight to the target go through `pool`'s buffers (a private pool
/// when null), at most one per thread. `progress` (when given) is told the bytes read ("read").
/// Adds what it needed and read to `counts`. Jobs whose target is device memory (`on_device`)
/// are copied to the device through `window` (required then), one slot per thread at a time.
CAIRN_INLINE result<void> run_copies(storage_ref st,
                                     const checkpoint_metadata& m,
                                     const std::vector<copy_job>& jobs,
                                     int threads,
                                     read_counts& counts,
                                     buffer_pool* pool = nullptr,
                                     const progress_callback* progress = nullptr,
                                     cuda::staging_window* window = nullptr);

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/native/box_reader-inl.hpp"
#endif
