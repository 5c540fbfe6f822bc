// cairn/core/sharded_object-inl.hpp: the bodies of cairn/core/sharded_object.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/core/codec.hpp"
#include "cairn/core/sharded_object.hpp"

namespace cairn {

CAIRN_INLINE std::string object_unique_key(const std::string& key,
                                           const shape& offset,
                                           const shape& global) {
  auto join = [](const shape& s) {
    std::string r;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i) r += '.';
      r += std::to_string(s[i]);
    }
    return r;
  };
  return key + "/shard_" + join(offset) + "_" + join(global);
}

}  // namespace cairn
