// cairn/pipeline/load_cache.hpp: `load_plan_cache`, what a load reuses when it loads the same
// checkpoint the same way again (a restart loop, an evaluation job that reloads): the chunks it
// read from a format version 4 checkpoint's index files.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"

namespace cairn {

namespace detail {
struct load_plan_cache_access;
}  // namespace detail

/// Remembers what the last load made with it read of a format version 4 checkpoint's index
/// files: the chunks of the tensors it loaded. A later load of the same checkpoint (the same
/// place and save id: a checkpoint written again gets a new id) asking for the same boxes
/// reads no index file again (`load_stats::index_reused`). One cache per rank and checkpoint
/// series; not thread-safe. The checkpointer keeps one for its loads.
class load_plan_cache {
 public:
  /// Loads that reused the cached index chunks.
  std::size_t hits() const noexcept { return hits_; }
  /// Loads that read the index (and refilled the cache).
  std::size_t misses() const noexcept { return misses_; }

 private:
  friend struct detail::load_plan_cache_access;
  std::string where_, save_id_;
  index_wants wants_;
  std::optional<checkpoint_metadata> metadata_;
  std::size_t hits_ = 0, misses_ = 0;
};

namespace detail {

/// The pipeline's access to a `load_plan_cache`.
struct load_plan_cache_access {
  /// The metadata with the index chunks a load of `wants` from the checkpoint `save_id` at
  /// `where` read before, or nullptr (counted as a miss).
  static const checkpoint_metadata* find(load_plan_cache& c,
                                         std::string_view where,
                                         std::string_view save_id,
                                         const index_wants& wants) {
    if (c.metadata_ && c.where_ == where && c.save_id_ == save_id && c.wants_ == wants) {
      ++c.hits_;
      return &*c.metadata_;
    }
    ++c.misses_;
    return nullptr;
  }
  /// Remembers `m` (its index chunks for `wants` read) as the load of `save_id` at `where`.
  static void store(load_plan_cache& c,
                    std::string where,
                    std::string save_id,
                    index_wants wants,
                    const checkpoint_metadata& m) {
    c.where_ = std::move(where);
    c.save_id_ = std::move(save_id);
    c.wants_ = std::move(wants);
    c.metadata_ = m;
  }
};

}  // namespace detail

}  // namespace cairn
