// cairn/manager/presets-inl.hpp: the bodies of cairn/manager/presets.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <utility>

#include "cairn/manager/presets.hpp"

namespace cairn {

CAIRN_INLINE bool has_prefix(std::string_view key, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return key.starts_with(p); });
}

CAIRN_INLINE load_options with_preset(load_preset preset, load_options base, state_parts parts) {
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
