// cairn/format/writers.hpp: the writers' half of the format registry (format/registry.hpp holds
// the readers'): save strategies made by format id, as a trainer's configuration names them.
// The native writer registers itself (format/native/strategy.hpp); torch_dist and the
// safetensors formats register from cairn/strategies.hpp.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/save_strategy.hpp"

namespace cairn {

/// Makes a save strategy (a format writer) with its default settings.
using strategy_maker = std::unique_ptr<save_strategy> (*)();

namespace detail {
CAIRN_INLINE std::map<std::string, strategy_maker, std::less<>>& strategy_makers();
}  // namespace detail

/// Registers the writer of format `id`. Called during static initialization by the header that
/// defines the strategy (format/native/strategy.hpp; format/dcp/strategy.hpp and
/// format/safetensors/strategy.hpp, which cairn/strategies.hpp includes); returns true.
CAIRN_INLINE bool register_save_strategy(std::string id, strategy_maker make);

/// The ids of every registered writer, sorted ("chunks", "native", "one_file", ...).
CAIRN_INLINE std::vector<std::string> save_strategy_ids();

/// A new save strategy writing format `id` with its default settings — what a trainer's
/// configuration names (`"native"`, `"torch_dist"`, `"one_file"`, `"per_tensor"`,
/// `"chunks"`). errc::not_found naming the registered ids otherwise.
CAIRN_INLINE result<std::unique_ptr<save_strategy>> make_save_strategy(std::string_view id);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/writers-inl.hpp"
#endif
