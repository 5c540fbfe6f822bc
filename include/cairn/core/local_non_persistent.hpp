// cairn/core/local_non_persistent.hpp: state that lives in the tree but is never saved.
#pragma once

#include <utility>

namespace cairn {

/// A value present in the state tree that is never written and is left untouched on load
/// (Megatron's LocalNonpersistentObject): scratch buffers, caches, handles.
template <class T>
struct local_non_persistent {
  T value{};
  /// The wrapped value.
  T& unwrap() noexcept { return value; }
  const T& unwrap() const noexcept { return value; }
};

}  // namespace cairn
