// cairn/format/save_strategy-inl.hpp: the bodies of cairn/format/save_strategy.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/format/save_strategy.hpp"

namespace cairn {

CAIRN_INLINE result<void> save_strategy::check(const leaf_list& leaves) const {
  (void)leaves;
  return ok();
}

CAIRN_INLINE result<void> save_strategy::assemble(planned_save& plan,
                                                  const std::vector<bytes>& reports,
                                                  storage_ref st,
                                                  const save_options& opt,
                                                  written_save& out) const {
  (void)plan, (void)reports, (void)st, (void)opt, (void)out;
  return ok();
}

CAIRN_INLINE std::vector<bytes> save_strategy::route(const planned_save& plan,
                                                     const written_save& w,
                                                     const save_options& opt) const {
  (void)w, (void)opt;
  return std::vector<bytes>(static_cast<std::size_t>(plan.index.world_size));
}

CAIRN_INLINE result<void> save_strategy::receive_routed(planned_save& plan,
                                                        const std::vector<bytes>& routed,
                                                        storage_ref st,
                                                        const save_options& opt,
                                                        written_save& out) const {
  (void)plan, (void)routed, (void)st, (void)opt, (void)out;
  return ok();
}

CAIRN_INLINE result<bool> save_strategy::committed(const planned_save& plan,
                                                   const written_save& w,
                                                   storage_ref st) const {
  (void)plan, (void)w, (void)st;
  return make_error(errc::io, "the " + std::string(name()) +
                                  " strategy cannot tell whether its commit took effect");
}

}  // namespace cairn
