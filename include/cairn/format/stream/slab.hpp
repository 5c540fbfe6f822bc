// cairn/format/stream/slab.hpp: the slab engine under every streaming writer (convert, unshard,
// the safetensors save's assembly): a tensor is cut into row-major slabs of bounded size, read
// from a `source` in batches into reused memory, converted to the output dtype, and handed to the
// writer's sink, so memory stays bounded by one slab whatever the tensor's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/plan/box.hpp"

namespace cairn::stream {

/// What every streaming writer is told, whatever its format.
struct stream_settings {
  /// Convert floating-point tensors (F16, BF16, F32, F64) to this floating dtype; other tensors
  /// (integers, bool, FP8) are written as they are. Exact when widening.
  std::optional<dtype> to_dtype;
  /// The most bytes read and converted at once: peak memory is about twice this plus the
  /// reader's own I/O buffers.
  std::uint64_t slab_bytes = std::uint64_t{64} << 20;
  /// Threads that write each slab (in parallel pieces of at least 8 MiB), where the format
  /// writes at offsets.
  int io_threads = 2;
};

/// What a streaming write wrote.
struct stream_stats {
  std::vector<std::string> files;    ///< objects written, in order
  std::size_t tensors = 0;           ///< tensors written
  std::size_t objects = 0;           ///< sharded (per-rank) objects written
  std::uint64_t bytes_read = 0;      ///< tensor bytes read from the source
  std::uint64_t bytes_written = 0;   ///< tensor bytes written (after dtype conversion)
  std::vector<std::string> skipped;  ///< non-tensor items not carried over
};

/// The floating dtypes `to_dtype` converts between (core/dtype.hpp).
using cairn::convertible_float;

/// The dtype tensor `t` is written as under `to`.
constexpr dtype output_dtype(dtype t, std::optional<dtype> to) noexcept {
  return to && convertible_float(t) ? *to : t;
}

/// Converts elements between floating dtypes (core/dtype.hpp).
using cairn::convert_elements;

/// Cuts a tensor into boxes of at most `max_bytes` (elements of `elem_size` bytes), each
/// contiguous in the tensor's row-major order and listed in that order: whole rows of the
/// outermost axis whose inner block fits, single-index prefixes above it. A rank-0 or empty
/// tensor is one box.
CAIRN_INLINE std::vector<box> slabs(const shape& dims,
                                    std::size_t elem_size,
                                    std::uint64_t max_bytes);

/// Slab memory reused across pumps (a conversion of many files allocates it once; it is never
/// zeroed: every byte is read into before use). Fresh memory costs a page fault per 4 KiB.
struct slab_buffers {
  /// At least `n` bytes of the buffer `which` (0: read, 1: converted).
  std::span<std::byte> get(int which, std::size_t n);

 private:
  std::unique_ptr<std::byte[]> buf_[2];
  std::size_t size_[2] = {0, 0};
};

namespace detail {

/// One slab to move: a box of a tensor and where its output bytes go inside the tensor.
struct slab_job {
  const tensor_entry* t;
  box region;
  std::uint64_t out_offset;  ///< byte offset of the slab in the output tensor
  dtype out_type;
};

/// The slabs of `ts` in order, each at most `settings.slab_bytes` in both its source and its
/// output dtype.
CAIRN_INLINE std::vector<slab_job> plan_jobs(const std::vector<const tensor_entry*>& ts,
                                             const stream_settings& settings);

/// Reads `jobs` in batches of at most `settings.slab_bytes` into one reused buffer, converts
/// dtypes, and hands each slab's output bytes to `sink(job, bytes)`. `progress` (when not null)
/// is told the source bytes done after each batch; `buffers`: slab memory to reuse.
template <class Sink>
result<void> pump(source& src,
                  const std::vector<slab_job>& jobs,
                  const stream_settings& settings,
                  stream_stats& stats,
                  cairn::detail::progress_meter* progress,
                  Sink&& sink,
                  slab_buffers* buffers = nullptr) {
  std::optional<slab_buffers> own;
  if (!buffers) buffers = &own.emplace();
  std::size_t i = 0;
  while (i < jobs.size()) {
    std::size_t j = i;
    std::uint64_t bytes = 0;
    std::vector<box_read> reqs;
    std::vector<std::uint64_t> at;
    while (j < jobs.size()) {
      std::uint64_t b =
          static_cast<std::uint64_t>(jobs[j].region.volume()) * dtype_size(jobs[j].t->type);
      if (j > i && bytes + b > settings.slab_bytes) break;
      at.push_back(bytes);
      bytes += b;
      ++j;
    }
    std::span<std::byte> buf = buffers->get(0, static_cast<std::size_t>(bytes));
    for (std::size_t q = i; q < j; ++q) {
      std::uint64_t b =
          static_cast<std::uint64_t>(jobs[q].region.volume()) * dtype_size(jobs[q].t->type);
      reqs.push_back(
          {jobs[q].t->key, jobs[q].region, buf.subspan(static_cast<std::size_t>(at[q - i]), b)});
    }
    CAIRN_TRY(src.read(reqs));
    for (std::size_t q = i; q < j; ++q) {
      const slab_job& job = jobs[q];
      std::span<const std::byte> in = reqs[q - i].out;
      if (job.out_type != job.t->type) {
        std::size_t m = in.size() / dtype_size(job.t->type) * dtype_size(job.out_type);
        std::span<std::byte> conv = buffers->get(1, m);
        convert_elements(job.t->type, job.out_type, in, conv);
        in = conv;
      }
      CAIRN_TRY(sink(job, in));
      stats.bytes_read += reqs[q - i].out.size();
      stats.bytes_written += in.size();
    }
    if (progress) progress->add(bytes);
    i = j;
  }
  return ok();
}

}  // namespace detail

}  // namespace cairn::stream

#if CAIRN_HEADER_ONLY
#  include "cairn/format/stream/slab-inl.hpp"
#endif
