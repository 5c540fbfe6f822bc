// cairn/storage/pointer.hpp: pointer objects, a small text object naming another checkpoint or
// folder beside it (the checkpointer's `latest` and tags, DeepSpeed's `latest`).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::detail {

/// The name pointer object `ptr` holds (its text, trimmed of trailing newlines and spaces), or
/// nullopt when it is absent, larger than 4 KiB, or holds something that is not one valid
/// object name component (empty, with a '/', "..").
CAIRN_INLINE result<std::optional<std::string>> read_pointer(storage_ref root,
                                                             std::string_view ptr);

/// Writes pointer `ptr` naming `name` (atomically, on backends whose put is).
CAIRN_INLINE result<void> write_pointer(storage_ref root,
                                        std::string_view ptr,
                                        const std::string& name);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/pointer-inl.hpp"
#endif
