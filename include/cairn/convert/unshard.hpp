// cairn/convert/unshard.hpp: `unshard` (any readable checkpoint -> consolidated safetensors,
// DeepSpeed zero_to_fp32's job), `convert` (-> safetensors or PyTorch DCP / Megatron torch_dist),
// both streaming with memory bounded by one slab, and `consolidate` (whole tensors in memory,
// DeepSpeed's get_fp32_state_dict_from_zero_checkpoint). Notes in docs/unshard.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/load.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::convert {

/// Output formats of `convert` (the safetensors ones are also `unshard`'s).
enum class output_format {
  one_file,    ///< one `model.safetensors`
  per_tensor,  ///< one `<key>.safetensors` per tensor ('/' in keys becomes '-'), plus the index
  chunks,      ///< `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus the index
  torch_dist,  ///< PyTorch DCP (`.metadata`, `__0_0.distcp`) + Megatron `metadata.json`,
               ///< `common.pt`
  native,      ///< cairn's own format, one data file written streaming
};

/// The output format's command-line name ("one_file", "torch_dist", ...).
constexpr std::string_view format_name(output_format s) noexcept {
  switch (s) {
    case output_format::one_file:
      return "one_file";
    case output_format::per_tensor:
      return "per_tensor";
    case output_format::chunks:
      return "chunks";
    case output_format::torch_dist:
      return "torch_dist";
    case output_format::native:
      return "native";
  }
  return "?";
}

/// Parses an output format name; errc::invalid_argument for unknown names.
CAIRN_INLINE result<output_format> parse_output_format(std::string_view s);

/// Options of `convert` and `unshard`.
struct convert_options {
  output_format format = output_format::one_file;
  /// `chunks`: the most tensor bytes per file (a tensor larger than this gets a file alone).
  std::uint64_t chunk_size = 5'000'000'000;
  /// Convert floating-point tensors (F16, BF16, F32, F64) to this floating dtype; other tensors
  /// (integers, bool, FP8) are written as they are. Exact when widening.
  std::optional<dtype> to_dtype;
  /// The most bytes read and converted at once: peak memory is about twice this plus the
  /// reader's own I/O buffers. Also the size of each DCP item in `torch_dist` output.
  std::uint64_t slab_bytes = std::uint64_t{64} << 20;
  /// The safetensors `__metadata__` of every file.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  /// Threads that write each slab (in parallel pieces of at least 8 MiB).
  int io_threads = 2;
  /// `torch_dist`: which torch module paths `.metadata` names.
  dcp::flavor dcp_flavor = dcp::flavor::torch2;
  /// Told how many source tensor bytes are done ("convert"; after each slab).
  progress_callback progress;
  /// Write over a checkpoint (of any format) already at the destination; without it the
  /// conversion fails with `errc::already_exists` and leaves it as it is.
  bool overwrite = false;
};

/// What a conversion wrote.
struct convert_stats {
  std::vector<std::string> files;    ///< objects written, in order
  std::size_t tensors = 0;           ///< tensors written
  std::size_t objects = 0;           ///< sharded (per-rank) objects written
  std::uint64_t bytes_read = 0;      ///< tensor bytes read from the source
  std::uint64_t bytes_written = 0;   ///< tensor bytes written (after dtype conversion)
  std::vector<std::string> skipped;  ///< non-tensor items not carried over
};

/// True for the floating dtypes `to_dtype` converts between.
constexpr bool convertible_float(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}

/// The dtype tensor `t` is written as under `to`.
constexpr dtype output_dtype(dtype t, std::optional<dtype> to) noexcept {
  return to && convertible_float(t) ? *to : t;
}

/// Converts `in` (elements of `from`) into `out` (the same count of `to`). Widening
/// (F16/BF16 -> F32/F64, F32 -> F64) is exact; narrowing rounds to nearest even.
CAIRN_INLINE void convert_elements(dtype from,
                                   dtype to,
                                   std::span<const std::byte> in,
                                   std::span<std::byte> out);

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

/// The safetensors split of a safetensors output format (`one_file` for any other).
constexpr safetensors::file_split split_of(output_format f) noexcept {
  return f == output_format::per_tensor ? safetensors::file_split::per_tensor
         : f == output_format::chunks   ? safetensors::file_split::chunks
                                        : safetensors::file_split::one_file;
}

/// The safetensors files of `ts` in `opt.format` (one_file, per_tensor or chunks of at most
/// `opt.chunk_size` bytes), with the dtypes `opt.to_dtype` converts to. Deterministic.
CAIRN_INLINE result<std::vector<safetensors::planned_file>> plan_safetensors(
    const std::vector<tensor_entry>& ts, const convert_options& opt);

namespace detail {

/// One slab to move: a box of a tensor and where its output bytes go inside the tensor.
struct slab_job {
  const tensor_entry* t;
  box region;
  std::uint64_t out_offset;  ///< byte offset of the slab in the output tensor
  dtype out_type;
};

/// Reads `jobs` in batches of at most `slab_bytes` into one reused buffer, converts dtypes,
/// and hands each slab's output bytes to `sink(job, bytes)`.
template <class Sink>
result<void> pump(source& src,
                  const std::vector<slab_job>& jobs,
                  const convert_options& opt,
                  convert_stats& stats,
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
      if (j > i && bytes + b > opt.slab_bytes) break;
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

CAIRN_INLINE std::vector<slab_job> plan_jobs(const std::vector<const tensor_entry*>& ts,
                                             const convert_options& opt);

}  // namespace detail

/// Writes the planned safetensors file `f`, reading its tensors from `src` one slab at a time in
/// file order (the disk sees one sequential stream; memory bounded by `opt.slab_bytes`).
/// `progress`: told the source bytes done (none when null); `buffers`: slab memory to reuse.
CAIRN_INLINE result<void> write_safetensors_file(source& src,
                                                 storage_ref dst,
                                                 const safetensors::planned_file& f,
                                                 const convert_options& opt,
                                                 convert_stats& stats,
                                                 cairn::detail::progress_meter* progress = nullptr,
                                                 slab_buffers* buffers = nullptr);

namespace detail {

CAIRN_INLINE result<void> write_safetensors(source& src,
                                            storage_ref dst,
                                            const convert_options& opt,
                                            convert_stats& stats,
                                            cairn::detail::progress_meter* progress);

/// Writes `src` as a DCP checkpoint in Megatron's torch_dist layout, with `objects` (the
/// source's sharded objects) as u8 items.
CAIRN_INLINE result<void> write_torch_dist(source& src,
                                           storage_ref dst,
                                           const convert_options& opt,
                                           const std::map<std::string, object_entry>& objects,
                                           convert_stats& stats,
                                           cairn::detail::progress_meter* progress);

/// Writes `src` as a native cairn checkpoint: every slab becomes a chunk of one data file,
/// checksummed per block as it streams past, then `objects` (the source's sharded objects);
/// common values go to the common-state file; `metadata.json` is written last. The save id is
/// derived from the tensor list, so the same source gives byte-identical output.
CAIRN_INLINE result<void> write_native(source& src,
                                       storage_ref dst,
                                       const convert_options& opt,
                                       const std::map<std::string, object_entry>& objects,
                                       convert_stats& stats,
                                       cairn::detail::progress_meter* progress);

}  // namespace detail

/// Rewrites the checkpoint `src` into `dst` (which should be empty) in `opt.format`, streaming:
/// tensors are read and written one slab (`opt.slab_bytes`) at a time, never whole. The same
/// source and options give byte-identical output. Non-tensor items that have no place in the
/// target are listed in `convert_stats::skipped`.
///
///     cairn::file_storage in{"ckpt/step_100"}, out{"hf/step_100"};
///     auto src = cairn::convert::open_source(in).value();
///     cairn::convert::convert(*src, out, {.format =
///     cairn::convert::output_format::chunks}).value();
CAIRN_INLINE result<convert_stats> convert(source& src,
                                           storage_ref dst,
                                           const convert_options& opt);

/// Consolidates a sharded checkpoint (any readable format, distributed-optimizer slices
/// included) into safetensors — what DeepSpeed's `zero_to_fp32.py` does, streaming.
/// `opt.format` must be one_file, per_tensor or chunks.
CAIRN_INLINE result<convert_stats> unshard(source& src,
                                           storage_ref dst,
                                           const convert_options& opt);

/// Every tensor of `src` whole in memory, floating tensors converted to `to` when given — the
/// equivalent of DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint`. Needs memory for the
/// whole model; use `unshard` to stream to files instead.
CAIRN_INLINE result<std::map<std::string, tensor_data>> consolidate(source& src,
                                                                    std::optional<dtype> to = {});

}  // namespace cairn::convert

#if CAIRN_HEADER_ONLY
#  include "cairn/convert/unshard-inl.hpp"
#endif
