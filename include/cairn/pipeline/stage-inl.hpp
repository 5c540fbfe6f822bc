// cairn/pipeline/stage-inl.hpp: the bodies of cairn/pipeline/stage.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/pipeline/stage.hpp"

namespace cairn::detail {

CAIRN_INLINE device_leaf_staging::~device_leaf_staging() {
  stager_.reset();  // waits for pending copies
  if (pool_ && used_) pool_->reset();
}

CAIRN_INLINE result<void> device_leaf_staging::to_host(leaf_list& leaves,
                                                       const cuda::runtime_api* runtime) {
  if (!start(runtime)) return ok();
  std::vector<std::size_t> which = device_leaves(leaves);
  if (which.empty()) return ok();
  CAIRN_TRY(take_pool());
  std::vector<cuda::stage_item> items;
  for (std::size_t i : which) {
    const tensor_leaf& t = leaves.tensors[i];
    items.push_back({t.data, t.nbytes, t.sharding.key});
  }
  CAIRN_TRY_ASSIGN(auto spans, stager_->stage(items));
  for (std::size_t k = 0; k < which.size(); ++k) leaves.tensors[which[k]].data = spans[k].data();
  return stager_->wait();
}

CAIRN_INLINE result<void> device_leaf_staging::redirect(leaf_list& leaves,
                                                        const cuda::runtime_api* runtime) {
  if (!start(runtime)) return ok();
  std::vector<std::size_t> which = device_leaves(leaves);
  if (which.empty()) return ok();
  CAIRN_TRY(take_pool());
  std::vector<std::size_t> sizes;
  for (std::size_t i : which) sizes.push_back(leaves.tensors[i].nbytes);
  CAIRN_TRY(pool_->reserve(cuda::staging_pool::bytes_for(sizes)));
  for (std::size_t i : which) {
    tensor_leaf& t = leaves.tensors[i];
    CAIRN_TRY_ASSIGN(auto span, pool_->acquire(t.nbytes));
    back_.push_back({t.data, span.data(), t.nbytes, t.sharding.key});
    t.data = span.data();
  }
  return ok();
}

CAIRN_INLINE result<void> device_leaf_staging::to_device() {
  if (back_.empty()) return ok();
  CAIRN_TRY(stager_->unstage(back_));
  return stager_->wait();
}

CAIRN_INLINE std::vector<std::size_t> device_leaf_staging::device_leaves(
    const leaf_list& leaves) const {
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
    const tensor_leaf& t = leaves.tensors[i];
    if (t.nbytes > 0 && stager_->classify(t.data) == cuda::memory_kind::device) which.push_back(i);
  }
  return which;
}

CAIRN_INLINE bool device_leaf_staging::start(const cuda::runtime_api* runtime) {
  const cuda::runtime_api* rt = cuda::usable_runtime(runtime);
  if (!rt) return false;
  pool_ = shared_ ? shared_ : &own_.emplace(cuda::staging_pool_options{}, rt);
  stager_.emplace(*pool_, cuda::stager_options{.runtime = rt});
  return true;
}

CAIRN_INLINE result<void> device_leaf_staging::take_pool() {
  if (pool_->used() > 0)
    return make_error(errc::invalid_argument,
                      "the staging pool is in use (" + std::to_string(pool_->used()) +
                          " bytes acquired: an async save through it still in flight?)");
  used_ = true;
  return ok();
}

}  // namespace cairn::detail
