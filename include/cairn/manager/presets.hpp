// cairn/manager/presets.hpp: load presets for the usual resumes (everything; model and
// optimizer; model weights only; fine-tuning from a checkpoint), built on load_options' key
// selection. DeepSpeed's load_module_only / load_optimizer_states / load_lr_scheduler_states,
// Composer's load_weights_only, ColossalAI's finetune.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"

namespace cairn {

/// Which keys of a trainer's state belong to which part, by key prefix. The defaults match the
/// usual layout ("model.weight", "optim.exp_avg", "sched.last_epoch"); keys under none of them
/// (the step, the data position, RNG state) are the counters and progress.
struct state_parts {
  std::vector<std::string> model = {"model.", "module."};
  std::vector<std::string> optimizer = {"optim.", "optimizer."};
  std::vector<std::string> scheduler = {"sched.", "scheduler.", "lr_scheduler."};
};

/// What a load brings back.
enum class load_preset {
  everything,           ///< the whole tree: resume where training stopped
  model_and_optimizer,  ///< model and optimizer state; the scheduler and counters keep theirs
  model_only,           ///< model weights only (DeepSpeed load_module_only, Composer weights only)
  fine_tune,            ///< model weights only, for a new run: everything else keeps the values
                        ///< the tree starts with (counters from zero, a fresh optimizer)
};

/// Whether `key` starts with one of `prefixes`.
CAIRN_INLINE bool has_prefix(std::string_view key, const std::vector<std::string>& prefixes);

/// `base` with the key selection of `preset`: an `edit_keys` that keeps only the parts the
/// preset loads (after `base.edit_keys`, if any). Keys not loaded keep the tree's values. The
/// checkpoint keys a preset leaves out are expected, so strict modes that report missing keys
/// (`*_all`) become their `*_unexpected` counterparts. `model_only` and `fine_tune` select the
/// same keys; `fine_tune` says why (a new run starting from trained weights).
CAIRN_INLINE load_options with_preset(load_preset preset,
                                      load_options base = {},
                                      state_parts parts = {});

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/manager/presets-inl.hpp"
#endif
