// cairn/pipeline/stage-inl.hpp: the bodies of cairn/pipeline/stage.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>

#include "cairn/format/native/reader.hpp"
#include "cairn/pipeline/stage.hpp"

namespace cairn::detail {

CAIRN_INLINE window_shape shape_window(std::uint64_t window_bytes,
                                       std::uint64_t block_size,
                                       int threads) {
  const std::uint64_t per_thread = window_bytes / static_cast<std::uint64_t>(std::max(1, threads));
  std::uint64_t piece = std::clamp(per_thread, block_size, std::max(block_size, max_io_bytes));
  piece = piece / block_size * block_size;
  const std::uint64_t slots = std::max<std::uint64_t>(1, window_bytes / piece);
  return {static_cast<std::size_t>(piece), static_cast<std::size_t>(slots)};
}

CAIRN_INLINE device_leaf_staging::~device_leaf_staging() {
  window_.reset();  // waits for its copies
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

CAIRN_INLINE result<cuda::staging_window*> device_leaf_staging::open_window(
    leaf_list& leaves,
    const cuda::runtime_api* runtime,
    std::uint64_t window_bytes,
    std::uint64_t block_size,
    int threads) {
  if (!start(runtime)) return nullptr;
  std::vector<std::size_t> which = device_leaves(leaves);
  if (which.empty()) return nullptr;
  CAIRN_TRY(take_pool());
  std::uint64_t device_bytes = 0;
  for (std::size_t i : which) {
    leaves.tensors[i].on_device = true;
    device_bytes += leaves.tensors[i].nbytes;
  }
  std::uint64_t window = window_bytes;
  if (window == 0)
    window = std::max<std::uint64_t>(
        shared_ && pool_->capacity() > 0 ? pool_->capacity() : default_staging_window, block_size);
  window = std::min(window, std::max(device_bytes, block_size));
  const window_shape shape = shape_window(window, block_size, threads);
  CAIRN_TRY_ASSIGN(window_, cuda::staging_window::open(*pool_, *stager_->runtime(),
                                                       shape.piece_bytes, shape.slots));
  return window_.get();
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
  // A private pool is allocated once, to the size asked: no rounding up to grow into.
  pool_ = shared_ ? shared_ : &own_.emplace(cuda::staging_pool_options{.granularity = 4096}, rt);
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
