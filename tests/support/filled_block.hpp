// Test tensors filled as `cairn_test::fill_block` fills them, whole or as one block, and a
// distributed optimizer's flat slice of a block: what the convert tests save and compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "tests/support/test_util.hpp"

namespace cairn_test {

/// The bytes of `block` of tensor `key` (dtype `t`, shape `global`) as `fill_block` fills them.
inline std::vector<std::byte> filled_block(const std::string& key,
                                           cairn::dtype t,
                                           const cairn::shape& global,
                                           const cairn::box& block) {
  std::vector<std::byte> out(static_cast<std::size_t>(block.volume()) * cairn::dtype_size(t));
  fill_block(key, t, global, block, out.data());
  return out;
}

/// The whole tensor `key` as `fill_block` fills it.
inline std::vector<std::byte> filled_whole(const std::string& key,
                                           cairn::dtype t,
                                           const cairn::shape& global) {
  return filled_block(key, t, global, cairn::box{cairn::shape(global.size(), 0), global});
}

/// Elements [range.begin, range.end) of `block` (elements of `elem_size` bytes): a distributed
/// optimizer's flat slice of it.
inline std::vector<std::byte> flat_slice(const std::vector<std::byte>& block,
                                         std::size_t elem_size,
                                         cairn::flat_range range) {
  const auto es = static_cast<std::int64_t>(elem_size);
  return {block.begin() + range.begin * es, block.begin() + range.end * es};
}

}  // namespace cairn_test
