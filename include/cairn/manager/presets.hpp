// cairn/manager/presets.hpp: load presets for the usual resumes (everything; model and
// optimizer; model weights only; fine-tuning from a checkpoint), built on load_options' key
// selection. DeepSpeed's load_module_only / load_optimizer_states / load_lr_scheduler_states,
// Composer's load_weights_only, ColossalAI's finetune.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
inline bool has_prefix(std::string_view key, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return key.starts_with(p); });
}

/// `base` with the key selection of `preset`: an `edit_keys` that keeps only the parts the
/// preset loads (after `base.edit_keys`, if any). Keys not loaded keep the tree's values. The
/// checkpoint keys a preset leaves out are expected, so strict modes that report missing keys
/// (`*_all`) become their `*_unexpected` counterparts. `model_only` and `fine_tune` select the
/// same keys; `fine_tune` says why (a new run starting from trained weights).
inline load_options with_preset(load_preset preset,
                                load_options base = {},
                                state_parts parts = {}) {
  if (preset == load_preset::everything) return base;
  auto keep = [preset, parts = std::move(parts)](const std::string& key) {
    if (has_prefix(key, parts.model)) return true;
    return preset == load_preset::model_and_optimizer && has_prefix(key, parts.optimizer);
  };
  auto previous = std::move(base.edit_keys);
  base.edit_keys = [keep, previous](std::vector<std::string>& keys) {
    if (previous) previous(keys);
    std::erase_if(keys, [&](const std::string& k) { return !keep(k); });
  };
  // The checkpoint keys the preset leaves out are not loaded by design: not "missing".
  if (base.strict == strict_mode::log_all) base.strict = strict_mode::log_unexpected;
  if (base.strict == strict_mode::raise_all) base.strict = strict_mode::raise_unexpected;
  if (base.strict == strict_mode::return_all) base.strict = strict_mode::return_unexpected;
  return base;
}

}  // namespace cairn
