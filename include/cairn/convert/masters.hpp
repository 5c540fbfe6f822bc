// cairn/convert/masters.hpp: a source seen through a key selection (`select_keys`), and the
// selection that takes a distributed optimizer's fp32 master weights under the model's keys
// (`fp32_masters`): what Megatron's and DeepSpeed's fp32 recovery give a mixed-precision run.
// Notes in docs/unshard.md.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cairn/convert/source.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::convert {

/// Which items of a source a conversion takes, and under which key: the output key for a
/// source key (a tensor's key, a common value's path, a sharded object's key), or nothing to
/// leave the item out.
using key_selector = std::function<std::optional<std::string>(std::string_view key)>;

/// `src` seen through `select`: only the items it keeps, under the keys it gives; reads go to
/// `src` (which must outlive the view). Two tensors given one output key are refused
/// (errc::invalid_argument naming both source keys); so are two common values, when read.
/// Content metadata and the saved world size are `src`'s.
CAIRN_INLINE result<std::unique_ptr<source>> select_keys(source& src, key_selector select);

/// The selection that writes the model of a mixed-precision checkpoint in fp32: each parameter
/// that a distributed optimizer keeps fp32 master weights of is taken from those masters, under
/// the model's key; the optimizer's other state is left out; everything else (frozen
/// parameters, buffers, other state) is kept as saved. The masters it knows:
///
/// - cairn's libtorch adapter (`optimizer_state` with `masters`): `<opt>.state.<name>.fp32_param`,
///   written under the one model key that is `<name>` or ends with `.<name>`;
/// - Megatron's distributed optimizer: `<opt>.state.fp32_param.<key>` (`fully_sharded_model_space`)
///   and `<opt>.state.param.<key>` (`fully_reshardable`, where `<key>` is a model tensor),
///   written under `<key>`.
///
/// Fails with errc::invalid_argument when `src` holds no masters, when a master's model key is
/// missing or ambiguous, or when its shape is not the model tensor's (naming both keys).
/// DeepSpeed's ZeRO folders need none of this: format `deepspeed` reads their masters already.
CAIRN_INLINE result<key_selector> fp32_masters(const source& src);

}  // namespace cairn::convert

#if CAIRN_HEADER_ONLY
#  include "cairn/convert/masters-inl.hpp"
#endif
