// cairn/storage/names.hpp: validation of object names shared by every backend (and by yours), so a
// name rejected by the file backend is rejected by the memory backend too.
#pragma once

#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

/// Why `name` is not a valid object name, or an empty string when it is valid.
///
/// A valid name is a non-empty relative path with '/' separators whose components are neither
/// empty, "." nor "..", and which contains no NUL byte: "a/b/c.bin" is valid; "", "/a", "a//b",
/// "a/", "./a" and "a/../b" are not.
CAIRN_INLINE std::string object_name_problem(std::string_view name);

/// Succeeds when `name` is a valid object name, else an errc::invalid_argument error naming it.
CAIRN_INLINE result<void> check_object_name(std::string_view name);

/// Succeeds when `prefix` may be passed to `list`: empty, or a prefix of a valid name (it may end
/// in '/' or in a partial component); never absolute, and the components before its last '/' are
/// valid name components.
CAIRN_INLINE result<void> check_list_prefix(std::string_view prefix);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/names-inl.hpp"
#endif
