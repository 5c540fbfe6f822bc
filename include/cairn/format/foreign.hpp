// cairn/format/foreign.hpp: registers the readers of the foreign formats (PyTorch DCP, in
// format/dcp/reader.hpp, safetensors, in format/safetensors/reader.hpp, torch.save state
// dicts, in format/torch/state_dict.hpp, and DeepSpeed ZeRO checkpoints, in
// format/deepspeed/zero.hpp, which this header also makes detectable) with the format
// registry (format/registry.hpp), so that `load`, `read_any_metadata` and the CLI read them.
#pragma once

#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/deepspeed/zero.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/reader.hpp"
#include "cairn/format/torch/state_dict.hpp"

namespace cairn {

// Every file that includes this header makes `load` and `read_any_metadata` read these
// formats (format/registry.hpp keeps the registry).
static_assert(dcp::metadata_name == format_files::dcp_metadata);
static_assert(safetensors::index_name == format_files::safetensors_index);
namespace detail {
inline const bool foreign_formats_registered =
    register_format_reader("torch_dist", &dcp_as_metadata, &dcp_content_metadata) &&
    register_format_reader("safetensors", &safetensors_as_metadata) &&
    register_format_reader("torch_save", &torch_save_as_metadata) &&
    register_format(format_driver{"deepspeed", 25, {}, &holds_deepspeed, &deepspeed_as_metadata});
}  // namespace detail

}  // namespace cairn
