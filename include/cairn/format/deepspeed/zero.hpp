// cairn/format/deepspeed/zero.hpp: DeepSpeed ZeRO checkpoints (stages 1, 2 and 3) read as a
// checkpoint (format "deepspeed"): the fp32 master weights a ZeRO optimizer keeps as flat
// partitions, one file per data-parallel rank, mapped back to the model's parameter names as
// DeepSpeed's `zero_to_fp32.py` does, each rank's partition read in place from its `torch.save`
// archive; frozen parameters and buffers from the model-states files; the step counters as
// common values. So `load`, `convert` and `unshard` take a DeepSpeed training's checkpoint on
// any number of ranks. The layout is DeepSpeed 0.16's (docs/torch-formats.md says what was
// checked against what).
#pragma once

#include <string>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Describes the DeepSpeed ZeRO checkpoint in `st` as cairn metadata. `st` is a DeepSpeed save
/// folder whose `latest` file names the tag folder, or a tag folder itself (`global_step7`):
/// `mp_rank_00_model_states.pt` (stages 1 and 2) or `zero_pp_rank_<r>_mp_rank_00_model_states.pt`
/// (stage 3, one per rank), and `[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`, one per
/// data-parallel rank. Tensors: each trainable parameter (by `param_shapes`) in fp32, its chunks
/// the pieces of it each rank's flat partition holds (stages 1 and 2: the group's parameters one
/// after the other over the ranks' partitions; stage 3: each parameter cut in ceil(numel / ranks)
/// elements per rank); frozen parameters (stages 2 and 3) and buffers in their saved dtype; tied
/// parameters (`shared_params`) under both names. Common values: `global_steps`,
/// `global_samples`, `skipped_steps`, `dp_world_size`, `mp_world_size`, `zero_stage`,
/// `ds_version`. Refused, naming the file: model parallelism (`mp_world_size` > 1), an optimizer
/// without a ZeRO stage (DeepSpeed's BF16_Optimizer), files missing or disagreeing with
/// `partition_count`, partitions shorter than their parameters.
CAIRN_INLINE result<checkpoint_metadata> deepspeed_as_metadata(storage_ref st);

namespace detail {
/// Whether `st` holds a DeepSpeed ZeRO checkpoint: optimizer-states files
/// (`*zero_pp_rank_<r>_mp_rank_<mp>_optim_states.pt`) at its top, or in the tag folder its
/// `latest` file names. Asked before torch_save (its files are `.pt` files too).
CAIRN_INLINE result<bool> holds_deepspeed(storage_ref st);
}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/deepspeed/zero-inl.hpp"
#endif
