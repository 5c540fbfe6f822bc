// cairn/format/commit.hpp: writing the object that commits a checkpoint, for every format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Puts a commit object and checks that storage holds all of it afterwards (one `size` call): a
/// backend that reports success for a short write (a lying disk) gets one more `put`; if the
/// object is still wrong, the commit fails (and `save_strategy::committed` decides what that
/// means).
CAIRN_INLINE result<void> put_checked(storage_ref st,
                                      std::string_view name,
                                      std::span<const std::byte> data);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/commit-inl.hpp"
#endif
