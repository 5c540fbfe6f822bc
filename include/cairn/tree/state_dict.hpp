// cairn/tree/state_dict.hpp: a dynamically built state tree, for models whose shape is known
// only at run time.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

class state_dict;

/// A sharded object whose value is raw bytes, the dynamic form of `sharded_object<T>`.
using byte_object = sharded_object<std::vector<std::byte>>;

/// A leaf that expands into other leaves when saved and loaded, and is merged back after a
/// load (Megatron's ShardedTensorFactory). `build` returns the leaves to save or load in its
/// place (visited under the factory's path); after a successful load, `merge` receives those
/// leaves, now filled, and writes the result into the user's data. Nothing extra goes to disk.
///
///     // a fused QKV weight saved as three tensors
///     cairn::factory qkv{
///         [&] { cairn::state_dict d; /* q, k, v views of the fused buffer */ return d; },
///         [&](cairn::state_dict& d) { /* copy back if the views were copies */ return cairn::ok();
///         }};
struct factory {
  std::function<state_dict()> build;
  std::function<result<void>(state_dict&)>
      merge;  ///< may be empty when build's leaves view the data
};

/// One entry of a state_dict: a tensor, a common value, an object, a nested state_dict, or a
/// factory. An entry named "" sits at the state_dict's own path rather than below it (a
/// factory that stands for one tensor builds `{"": tensor}`).
using state_dict_entry =
    std::variant<sharded_tensor<>, common_value, byte_object, std::unique_ptr<state_dict>, factory>;

/// A string-keyed tree of leaves built at run time. Entries are kept sorted by name. It is
/// visited like any other tree, saved, and loaded in place:
///
///     cairn::state_dict sd;
///     sd.add("embed", cairn::from_rank_offsets("embed", std::span(buf), {vocab / tp, dim},
///                                              {{0, tp_rank, tp}}));
///     sd.add("step", cairn::common_value::of(std::int64_t{step}));
///     sd.child("optim").add("lr", cairn::common_value::of(3e-4));
class state_dict {
 public:
  state_dict() = default;
  state_dict(state_dict&&) noexcept = default;
  state_dict& operator=(state_dict&&) noexcept = default;

  /// Adds (or replaces) a tensor entry.
  template <class T>
  sharded_tensor<>& add(std::string name, const sharded_tensor<T>& t) {
    return std::get<sharded_tensor<>>(set(std::move(name), sharded_tensor<>(t)));
  }
  /// Adds (or replaces) a common value.
  common_value& add(std::string name, common_value v) {
    return std::get<common_value>(set(std::move(name), std::move(v)));
  }
  /// Adds (or replaces) a common value from a C++ value.
  template <common_type T>
  common_value& add(std::string name, const T& v) {
    return add(std::move(name), common_value::of(v));
  }
  /// Adds (or replaces) a sharded object holding raw bytes.
  byte_object& add(std::string name, byte_object o) {
    return std::get<byte_object>(set(std::move(name), std::move(o)));
  }
  /// Adds (or replaces) a factory: leaves built when the tree is saved or loaded.
  factory& add(std::string name, factory f) {
    return std::get<factory>(set(std::move(name), std::move(f)));
  }
  /// Adds (or replaces) a nested state_dict built elsewhere.
  state_dict& add(std::string name, state_dict child);
  /// The nested state_dict called `name`, created when missing.
  state_dict& child(std::string name);

  /// The entry called `name`, or nullptr.
  state_dict_entry* find(std::string_view name);
  const state_dict_entry* find(std::string_view name) const;
  /// Removes the entry called `name`; returns whether it existed.
  bool erase(std::string_view name);

  /// All entries, sorted by name.
  std::map<std::string, state_dict_entry, std::less<>>& entries() noexcept { return entries_; }
  const std::map<std::string, state_dict_entry, std::less<>>& entries() const noexcept {
    return entries_;
  }
  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }

  /// Memory owned by this state_dict (zero-initialized), for leaves that need a buffer of
  /// their own, e.g. the parts a `factory` builds. Stays valid as long as the state_dict.
  template <class T>
  std::span<T> allocate(std::size_t count) {
    auto buf = std::make_shared<std::vector<T>>(count);
    std::span<T> view(*buf);
    owned_.push_back(std::move(buf));
    return view;
  }
  /// Keeps `owner` alive as long as this state_dict: memory of another kind its leaves view
  /// (a staging copy a factory made, a tensor handle).
  void keep_alive(std::shared_ptr<void> owner) { owned_.push_back(std::move(owner)); }

 private:
  state_dict_entry& set(std::string name, state_dict_entry e);
  std::map<std::string, state_dict_entry, std::less<>> entries_;
  std::vector<std::shared_ptr<void>> owned_;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/tree/state_dict-inl.hpp"
#endif
