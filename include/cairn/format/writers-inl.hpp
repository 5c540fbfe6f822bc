// cairn/format/writers-inl.hpp: the bodies of cairn/format/writers.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <functional>
#include <utility>

#include "cairn/format/writers.hpp"

namespace cairn::detail {

CAIRN_INLINE std::map<std::string, strategy_maker, std::less<>>& strategy_makers() {
  static std::map<std::string, strategy_maker, std::less<>> makers;
  return makers;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE bool register_save_strategy(std::string id, strategy_maker make) {
  detail::strategy_makers()[std::move(id)] = make;
  return true;
}

CAIRN_INLINE std::vector<std::string> save_strategy_ids() {
  std::vector<std::string> ids;
  for (const auto& [id, make] : detail::strategy_makers()) ids.push_back(id);
  return ids;
}

CAIRN_INLINE result<std::unique_ptr<save_strategy>> make_save_strategy(std::string_view id) {
  auto it = detail::strategy_makers().find(id);
  if (it == detail::strategy_makers().end()) {
    std::string known;
    for (const auto& k : save_strategy_ids()) known += (known.empty() ? "" : ", ") + k;
    return make_error(errc::not_found, "no save strategy '" + std::string(id) +
                                           "' (registered: " + known +
                                           "; include <cairn/strategies.hpp> for torch_dist and "
                                           "the safetensors formats)");
  }
  return it->second();
}

}  // namespace cairn
