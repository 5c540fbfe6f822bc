// cairn/core/bytes.hpp: the byte buffer type used wherever bytes are owned (messages between
// ranks, encoded objects, reports of a save's write step).
#pragma once

#include <cstddef>
#include <vector>

namespace cairn {

/// An owned run of bytes.
using bytes = std::vector<std::byte>;

}  // namespace cairn
