// Helpers shared by the cairn::torch tests: one rank, and a tensor saved alone and loaded back.
#pragma once

#include <utility>

#include "cairn/cairn.hpp"
#include "cairn/libtorch.hpp"

namespace cairn_test {

inline cairn::single_communicator solo;

/// `t` as real numbers (its real view when complex), for comparisons.
inline torch::Tensor view_real(const torch::Tensor& t) {
  return t.is_complex() ? torch::view_as_real(t) : t;
}

/// `t` saved alone as key "t" and loaded into `into`; returns the load's error, if any.
inline cairn::result<void> round_trip(const torch::Tensor& t, torch::Tensor into) {
  cairn::memory_storage mem;
  cairn::state_dict sd;
  sd.add("t", cairn::libtorch::tensor(t));
  auto saved = cairn::try_save(sd, mem, solo);
  if (!saved) return std::move(saved).err();
  cairn::state_dict back;
  back.add("t", cairn::libtorch::tensor(std::move(into)));
  auto loaded = cairn::try_load(back, mem, solo);
  if (!loaded) return std::move(loaded).err();
  return cairn::ok();
}

}  // namespace cairn_test
