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

#include "cairn/convert/masters.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/stream_writer.hpp"
#include "cairn/format/native/stream_writer.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/format/safetensors/stream_writer.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/writers.hpp"
#include "cairn/load.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::convert {

/// The built-in outputs of `convert` (the safetensors ones are also `unshard`'s), each the
/// stream writer of the same name; `convert_options::writer` names any registered writer.
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

/// Parses an output format name or alias (the stream writers' names: "safetensors", "dcp",
/// "cairn", ...); errc::invalid_argument for names that are not a built-in output.
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
  /// The output by name, overriding `format` when set: any registered stream writer
  /// (format/stream/writers.hpp), the built-in ones ("native", "torch_dist", "one_file", ...,
  /// and their aliases) or a format of your own.
  std::string writer;
  /// That writer's own settings by name, as text (see its `stream_writer::settings`); a name it
  /// does not declare is refused. `chunk_size` and `dcp_flavor` fill "chunk_size" and "flavor"
  /// unless given here.
  std::map<std::string, std::string> writer_options;
  /// Write the model with each parameter taken from the fp32 master weights its distributed
  /// optimizer saved, under the model's keys, and leave the optimizer's other state out
  /// (`fp32_masters`; `cairn unshard --fp32-masters`): a mixed-precision run's model in fp32.
  bool fp32_masters = false;
  /// Take only the items this keeps, under the keys it gives (`select_keys`); applied after
  /// `fp32_masters` when both are set.
  key_selector select;
};

/// What a conversion wrote.
using convert_stats = stream::stream_stats;

using stream::convert_elements;
using stream::convertible_float;
using stream::output_dtype;
using stream::slab_buffers;
using stream::slabs;

/// The safetensors split of a safetensors output format (`one_file` for any other).
constexpr safetensors::file_split split_of(output_format f) noexcept {
  return f == output_format::per_tensor ? safetensors::file_split::per_tensor
         : f == output_format::chunks   ? safetensors::file_split::chunks
                                        : safetensors::file_split::one_file;
}

/// The settings every streaming writer reads, from `opt`.
constexpr stream::stream_settings settings_of(const convert_options& opt) noexcept {
  return {opt.to_dtype, opt.slab_bytes, opt.io_threads};
}

/// The name of the output `opt` asks for: `opt.writer`, else `opt.format`'s name.
CAIRN_INLINE std::string writer_name(const convert_options& opt);

/// Rewrites the checkpoint `src` into `dst` (which should be empty) with the stream writer
/// `opt` names (`writer_name`), streaming: tensors are read and written one slab
/// (`opt.slab_bytes`) at a time, never whole. The same source and options give byte-identical
/// output. Non-tensor items that have no place in the target are listed in
/// `convert_stats::skipped`.
///
///     cairn::file_storage in{"ckpt/step_100"}, out{"hf/step_100"};
///     auto src = cairn::convert::open_source(in).value();
///     cairn::convert::convert(*src, out, {.format =
///     cairn::convert::output_format::chunks}).value();
CAIRN_INLINE result<convert_stats> convert(source& src,
                                           storage_ref dst,
                                           const convert_options& opt);

/// Consolidates a sharded checkpoint (any readable format, distributed-optimizer slices
/// included) into whole tensors — what DeepSpeed's `zero_to_fp32.py` does, streaming. The
/// writer must keep tensors whole (`stream_writer::whole_tensors`: one_file, per_tensor,
/// chunks).
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
