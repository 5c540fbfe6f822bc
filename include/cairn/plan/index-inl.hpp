// cairn/plan/index-inl.hpp: the bodies of cairn/plan/index.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/plan/index.hpp"

namespace cairn {

CAIRN_INLINE std::uint64_t extent::stored_bytes() const noexcept {
  if (!compressed()) return nbytes;
  std::uint64_t n = 0;
  for (auto b : block_stored) n += b;
  return n;
}

CAIRN_INLINE std::uint64_t tensor_record::stored_bytes() const {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.where.stored_bytes();
  return n;
}

CAIRN_INLINE std::uint64_t tensor_record::chunk_bytes() const {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.where.nbytes;
  return n;
}

}  // namespace cairn
