// cairn/pipeline/stage.hpp: the stage step of the synchronous save and load: tensor leaves
// that live in device memory go through host staging memory (a pool the caller owns, given in
// save_options::staging / load_options::staging, or one private to the call).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/detail/config.hpp"
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
  ~device_leaf_staging();

  /// Save side: stages every device leaf (waits for the copies).
  result<void> to_host(leaf_list& leaves, const cuda::runtime_api* runtime);

  /// Load side: points every device leaf at host staging memory.
  result<void> redirect(leaf_list& leaves, const cuda::runtime_api* runtime);

  /// Load side: copies the staged bytes to the device leaves (waits for the copies).
  result<void> to_device();

 private:
  /// The non-empty tensor leaves that live in device memory.
  std::vector<std::size_t> device_leaves(const leaf_list& leaves) const;
  bool start(const cuda::runtime_api* runtime);
  /// Claims the pool for this call: a shared pool must have nothing acquired.
  result<void> take_pool();
  cuda::staging_pool* shared_ = nullptr;
  cuda::staging_pool* pool_ = nullptr;
  bool used_ = false;
  std::optional<cuda::staging_pool> own_;
  std::optional<cuda::stager> stager_;
  std::vector<cuda::unstage_item> back_;
};

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/stage-inl.hpp"
#endif
