// cairn/tree/state_dict-inl.hpp: the bodies of cairn/tree/state_dict.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/tree/state_dict.hpp"

namespace cairn {

CAIRN_INLINE state_dict& state_dict::add(std::string name, state_dict child) {
  return *std::get<std::unique_ptr<state_dict>>(
      set(std::move(name), std::make_unique<state_dict>(std::move(child))));
}

CAIRN_INLINE state_dict& state_dict::child(std::string name) {
  auto it = entries_.find(name);
  if (it == entries_.end() || !std::holds_alternative<std::unique_ptr<state_dict>>(it->second))
    return *std::get<std::unique_ptr<state_dict>>(
        set(std::move(name), std::make_unique<state_dict>()));
  return *std::get<std::unique_ptr<state_dict>>(it->second);
}

CAIRN_INLINE state_dict_entry* state_dict::find(std::string_view name) {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

CAIRN_INLINE const state_dict_entry* state_dict::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

CAIRN_INLINE bool state_dict::erase(std::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

CAIRN_INLINE state_dict_entry& state_dict::set(std::string name, state_dict_entry e) {
  auto [it, inserted] = entries_.insert_or_assign(std::move(name), std::move(e));
  return it->second;
}

}  // namespace cairn
