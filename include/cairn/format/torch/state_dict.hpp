// cairn/format/torch/state_dict.hpp: `torch.save` state dicts read as a checkpoint (format
// "torch_save"): the `.pt` / `.pth` files a trainer without a distributed checkpoint writes
// (`torch.save(model.state_dict(), "model.pt")`, Hugging Face's `pytorch_model.bin` and its
// shards, Megatron's legacy `model_optim_rng.pt`), so that `load`, `convert` and `unshard`
// take them on any number of ranks. Each tensor is one chunk: its bytes are read in place from
// the archive's storage record, never materialized whole.
#pragma once

#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Describes the `torch.save` files at the top of `st` (`format_files::is_torch_save_file`:
/// `*.pt`, `*.pth`, `pytorch_model*.bin`; sorted by name)
/// as cairn metadata: every tensor found in them (keys are dict paths joined with '.', as
/// `torch_zip::find_tensors` makes them: `{"model": {"w": t}}` -> "model.w") becomes one chunk
/// at its storage record's bytes; scalars, strings and lists of numbers become common values
/// (`"iteration"`); other Python objects are left out. A key in two files is errc::corrupt
/// naming both; a non-contiguous view (a transposed tensor saved as is) errc::unsupported_version
/// naming the key and file (`cairn convert` cannot read it in place either: save it contiguous).
CAIRN_INLINE result<checkpoint_metadata> torch_save_as_metadata(storage_ref st);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/torch/state_dict-inl.hpp"
#endif
