// tests/support/leaf.hpp: a hand-made f32 tensor leaf, for tests that drive the load pipeline's
// phases below `load` (they take leaf lists, not trees).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cairn/plan/box.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn_test {

/// A tensor leaf over `data` for box `b` of tensor `key` (f32, `global`); its path is its key.
inline cairn::tensor_leaf f32_leaf(const std::string& key,
                                   std::vector<float>& data,
                                   const cairn::shape& global,
                                   const cairn::box& b) {
  cairn::tensor_leaf t;
  t.path = key;
  t.sharding.key = key;
  t.sharding.type = cairn::dtype::f32;
  t.sharding.global_shape = global;
  t.sharding.local_shape = b.size;
  t.sharding.global_offset = b.offset;
  t.data = reinterpret_cast<std::byte*>(data.data());
  t.nbytes = data.size() * 4;
  return t;
}

}  // namespace cairn_test
