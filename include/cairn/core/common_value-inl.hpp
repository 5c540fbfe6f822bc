// cairn/core/common_value-inl.hpp: the bodies of cairn/core/common_value.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/core/common_value.hpp"

namespace cairn {

CAIRN_INLINE std::string common_value::describe_type() const {
  if (kind == common_kind::string) return "string";
  return std::string(dtype_name(type)) + (kind == common_kind::scalar ? " scalar" : " vector");
}

}  // namespace cairn
