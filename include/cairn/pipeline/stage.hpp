// cairn/pipeline/stage.hpp: the stage step of the synchronous save and load: tensor leaves
// that live in device memory go through host staging memory (a pool the caller owns, given in
// save_options::staging / load_options::staging, or one private to the call).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// The smallest slot of a load's staging window (bytes): loads copy runs of any size, so slots
/// need not hold a checksum block.
inline constexpr std::uint64_t load_window_granularity = std::uint64_t{64} << 10;

/// How a staging window of at most `window_bytes` is cut for `threads` writer threads: slots
/// of whole checksum blocks (`block_size`), at most `max_io_bytes` and about
/// `window_bytes / threads` each (at least one block, even when the window is smaller).
struct window_shape {
  std::size_t piece_bytes = 0;
  std::size_t slots = 0;
};
CAIRN_INLINE window_shape shape_window(std::uint64_t window_bytes,
                                       std::uint64_t block_size,
                                       int threads);

/// Host staging memory for device-memory tensor leaves. A save whose writer reads device
/// items itself, and every load, go through a bounded window (`open_window`): the writer or
/// the reader copies each piece between the device and a window slot. A save whose writer does
/// not stages every device leaf first (`to_host`: copied into a pinned staging pool, the leaf
/// pointed there). Without a usable device (no runtime, or every call fails as on a machine
/// with no GPU) both are no-ops: every leaf is host memory.
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

  /// For a writer that reads device items itself (`reads_device_items`), and for every load:
  /// marks every device leaf `on_device` and opens a staging window their bytes go through,
  /// piece by piece; returns it (null without device leaves). The window holds at most
  /// `window_bytes` (0: the shared pool's capacity when it has one, else `default_staging_window`),
  /// and never more than the device leaves' bytes; its slots hold whole checksum blocks
  /// (`block_size`) and at most `max_io_bytes`, about `window_bytes / threads` each.
  result<cuda::staging_window*> open_window(leaf_list& leaves,
                                            const cuda::runtime_api* runtime,
                                            std::uint64_t window_bytes,
                                            std::uint64_t block_size,
                                            int threads);

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
  std::unique_ptr<cuda::staging_window> window_;
};

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/stage-inl.hpp"
#endif
