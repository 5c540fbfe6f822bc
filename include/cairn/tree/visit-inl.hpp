// cairn/tree/visit-inl.hpp: the bodies of cairn/tree/visit.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/tree/visit.hpp"

namespace cairn::detail {

CAIRN_INLINE std::string join_path(const std::string& parent, std::string_view name) {
  if (parent.empty()) return std::string(name);
  if (name.empty()) return parent;
  std::string p = parent;
  p += '.';
  p += name;
  return p;
}

}  // namespace cairn::detail
