// cairn/pipeline/stage.hpp: the stage step of the synchronous save and load: tensor leaves
// that live in device memory go through host staging memory (a pool the caller owns, given in
// save_options::staging / load_options::staging, or one private to the call).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// Host copies of device-memory tensor leaves. Save: `to_host` copies each device leaf into a
/// pinned staging pool and points the leaf there. Load: `redirect` points each device leaf at
/// staging memory, and `to_device` copies the loaded bytes back. Without a usable device (no
/// runtime, or every call fails as on a machine with no GPU) both are no-ops: every leaf is
/// host memory.
///
/// The pool is the caller's `shared` one when given (it allocates only when a call needs more
/// than it holds, so repeated saves allocate once) or one private to this object. A shared pool
/// must be idle (nothing acquired: no async save of the same pool in flight); it is reset when
/// this object dies.
class device_leaf_staging {
 public:
  /// Stages through `shared` when not null, else through a pool of its own.
  explicit device_leaf_staging(cuda::staging_pool* shared = nullptr) : shared_(shared) {}
  device_leaf_staging(const device_leaf_staging&) = delete;
  device_leaf_staging& operator=(const device_leaf_staging&) = delete;
  ~device_leaf_staging() {
    stager_.reset();  // waits for pending copies
    if (pool_ && used_) pool_->reset();
  }

  /// Save side: stages every device leaf (waits for the copies).
  result<void> to_host(leaf_list& leaves, const cuda::runtime_api* runtime) {
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

  /// Load side: points every device leaf at host staging memory.
  result<void> redirect(leaf_list& leaves, const cuda::runtime_api* runtime) {
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

  /// Load side: copies the staged bytes to the device leaves (waits for the copies).
  result<void> to_device() {
    if (back_.empty()) return ok();
    CAIRN_TRY(stager_->unstage(back_));
    return stager_->wait();
  }

 private:
  /// The non-empty tensor leaves that live in device memory.
  std::vector<std::size_t> device_leaves(const leaf_list& leaves) const {
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
      const tensor_leaf& t = leaves.tensors[i];
      if (t.nbytes > 0 && stager_->classify(t.data) == cuda::memory_kind::device)
        which.push_back(i);
    }
    return which;
  }
  bool start(const cuda::runtime_api* runtime) {
    const cuda::runtime_api* rt = cuda::usable_runtime(runtime);
    if (!rt) return false;
    pool_ = shared_ ? shared_ : &own_.emplace(cuda::staging_pool_options{}, rt);
    stager_.emplace(*pool_, cuda::stager_options{.runtime = rt});
    return true;
  }
  /// Claims the pool for this call: a shared pool must have nothing acquired.
  result<void> take_pool() {
    if (pool_->used() > 0)
      return make_error(errc::invalid_argument,
                        "the staging pool is in use (" + std::to_string(pool_->used()) +
                            " bytes acquired: an async save through it still in flight?)");
    used_ = true;
    return ok();
  }
  cuda::staging_pool* shared_ = nullptr;
  cuda::staging_pool* pool_ = nullptr;
  bool used_ = false;
  std::optional<cuda::staging_pool> own_;
  std::optional<cuda::stager> stager_;
  std::vector<cuda::unstage_item> back_;
};

}  // namespace cairn::detail
