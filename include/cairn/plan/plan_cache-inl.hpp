// cairn/plan/plan_cache-inl.hpp: the bodies of cairn/plan/plan_cache.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/core/checksum.hpp"
#include "cairn/plan/plan_cache.hpp"

namespace cairn::detail {

CAIRN_INLINE std::uint64_t structure_hash(const rank_desc& d) {
  rank_desc s;
  s.tensors = d.tensors;
  s.objects = d.objects;
  for (const auto& c : d.commons) s.commons.push_back(common_desc{c.path, 0});
  return checksum(encode(s));
}

CAIRN_INLINE bool plan_cache_access::usable(const save_plan_cache& c,
                                            int world,
                                            const plan_settings& want) {
  return c.valid_ && c.world_ == world && c.settings_.serves(want);
}

CAIRN_INLINE save_index plan_cache_access::hit(save_plan_cache& c) {
  ++c.hits_;
  return c.index_;
}

CAIRN_INLINE void plan_cache_access::store(save_plan_cache& c,
                                           int world,
                                           const plan_settings& made_with,
                                           std::vector<std::uint64_t> structure,
                                           const save_index& index) {
  ++c.misses_;
  c.valid_ = true;
  c.world_ = world;
  c.settings_ = made_with;
  c.structure_ = std::move(structure);
  c.index_ = index;
}

}  // namespace cairn::detail
