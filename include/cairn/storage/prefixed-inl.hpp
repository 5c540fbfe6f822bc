// cairn/storage/prefixed-inl.hpp: the bodies of cairn/storage/prefixed.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/storage/names.hpp"
#include "cairn/storage/prefixed.hpp"

namespace cairn {

CAIRN_INLINE result<prefixed_storage> prefixed_storage::make(storage_ref inner,
                                                             std::string prefix) {
  if (!prefix.empty()) {
    if (prefix.back() != '/')
      return make_error(errc::invalid_argument,
                        "a storage prefix must end in '/': \"" + prefix + "\"");
    CAIRN_TRY(check_object_name(std::string_view(prefix).substr(0, prefix.size() - 1)));
  }
  return prefixed_storage(inner, std::move(prefix));
}

CAIRN_INLINE result<std::vector<std::string>> prefixed_storage::list(std::string_view p) {
  CAIRN_TRY_ASSIGN(auto names, inner_.list(full(p)));
  for (auto& n : names) n.erase(0, prefix_.size());
  return names;
}

}  // namespace cairn
