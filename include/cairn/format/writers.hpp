// cairn/format/writers.hpp: the writers' half of the format registry (format/registry.hpp holds
// the readers'): save strategies made by format id, as a trainer's configuration names them.
// The native writer registers itself (format/native/strategy.hpp); torch_dist and the
// safetensors formats register from cairn/strategies.hpp.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/format/save_strategy.hpp"

namespace cairn {

/// Makes a save strategy (a format writer) with its default settings.
using strategy_maker = std::unique_ptr<save_strategy> (*)();

namespace detail {
inline std::map<std::string, strategy_maker, std::less<>>& strategy_makers() {
  static std::map<std::string, strategy_maker, std::less<>> makers;
  return makers;
}
}  // namespace detail

/// Registers the writer of format `id`. Called during static initialization by the header that
/// defines the strategy (format/native/strategy.hpp; format/dcp/strategy.hpp and
/// format/safetensors/strategy.hpp, which cairn/strategies.hpp includes); returns true.
inline bool register_save_strategy(std::string id, strategy_maker make) {
  detail::strategy_makers()[std::move(id)] = make;
  return true;
}

/// The ids of every registered writer, sorted ("chunks", "native", "one_file", ...).
inline std::vector<std::string> save_strategy_ids() {
  std::vector<std::string> ids;
  for (const auto& [id, make] : detail::strategy_makers()) ids.push_back(id);
  return ids;
}

/// A new save strategy writing format `id` with its default settings — what a trainer's
/// configuration names (`"native"`, `"torch_dist"`, `"one_file"`, `"per_tensor"`,
/// `"chunks"`). errc::not_found naming the registered ids otherwise.
inline result<std::unique_ptr<save_strategy>> make_save_strategy(std::string_view id) {
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
