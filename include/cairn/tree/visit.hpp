// cairn/tree/visit.hpp: compile-time visitation of user state trees. This is the only place
// templates walk user types; it turns a tree into a non-template `leaf_list`.
#pragma once

#include <algorithm>
#include <array>
#include <boost/pfr.hpp>
#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/core/codec.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/local_non_persistent.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/tree/fields.hpp"
#include "cairn/tree/leaves.hpp"
#include "cairn/tree/state_dict.hpp"

namespace cairn {
namespace detail {

template <class T>
struct is_sharded_tensor : std::false_type {};
template <class T>
struct is_sharded_tensor<sharded_tensor<T>> : std::true_type {};
template <class T>
struct is_sharded_object : std::false_type {};
template <class T>
struct is_sharded_object<sharded_object<T>> : std::true_type {};
template <class T>
struct is_non_persistent : std::false_type {};
template <class T>
struct is_non_persistent<local_non_persistent<T>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class V, class C, class A>
struct is_string_map<std::map<std::string, V, C, A>> : std::true_type {};
template <class V, class H, class E, class A>
struct is_string_map<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};
template <class T>
struct is_unordered_map : std::false_type {};
template <class V, class H, class E, class A>
struct is_unordered_map<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};
template <class T>
struct is_sequence : std::false_type {};
template <class V, class A>
struct is_sequence<std::vector<V, A>> : std::true_type {};
template <class V, std::size_t N>
struct is_sequence<std::array<V, N>> : std::true_type {};
template <class T>
struct is_tuple : std::false_type {};
template <class... Ts>
struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
concept has_adapter = requires(T& v) {
  adapter<T>::view(v);
};
template <class T>
concept has_fields = requires {
  fields_of<T>::names;
};

/// True when cairn can visit T (without looking inside containers' element types).
template <class T>
inline constexpr bool directly_visitable =
    is_sharded_tensor<T>::value || is_sharded_object<T>::value || is_non_persistent<T>::value ||
    std::is_same_v<T, state_dict> || std::is_same_v<T, factory> || has_adapter<T> ||
    common_type<T> || is_string_map<T>::value || is_sequence<T>::value || is_tuple<T>::value ||
    is_optional<T>::value || has_fields<T>;

/// `parent.name`; a state_dict entry named "" stands at its parent's path.
CAIRN_INLINE std::string join_path(const std::string& parent, std::string_view name);

/// Reports a type cairn cannot visit. The compiler's instantiation trace names the type
/// (`T`) and, for struct fields, the parent struct and field index.
template <class T, class Parent = void, std::size_t FieldIndex = 0>
constexpr void check_visitable() {
  static_assert(directly_visitable<T>,
                "cairn: this type cannot be visited in a state tree. Give it "
                "`static constexpr auto fields = cairn::field_names(...)`, specialize "
                "cairn::fields_of<T> or cairn::adapter<T>, make it a sharded_tensor, "
                "sharded_object or common value, or wrap it in cairn::local_non_persistent.");
}

/// Walks a tree and appends its leaves to a leaf_list.
struct flattener {
  leaf_list& out;

  template <class T>
  void visit(T& v, const std::string& path) {
    check_visitable<T>();
    visit_checked(v, path);
  }

  /// Appends the leaves of `v`, found at `path`, by its kind (`check_visitable` accepted `T`).
  template <class T>
  void visit_checked(T& v, const std::string& path) {
    if constexpr (is_sharded_tensor<T>::value) {
      visit_tensor(v, path);
    } else if constexpr (is_sharded_object<T>::value) {
      visit_object(v, path);
    } else if constexpr (is_non_persistent<T>::value) {
      // Never saved, never loaded.
    } else if constexpr (std::is_same_v<T, factory>) {
      visit_factory(v, path);
    } else if constexpr (std::is_same_v<T, state_dict>) {
      visit_state_dict(v, path);
    } else if constexpr (has_adapter<T>) {
      visit_adapted(v, path);
    } else if constexpr (common_type<T>) {
      visit_common(v, path);
    } else if constexpr (is_string_map<T>::value) {
      visit_string_map(v, path);
    } else if constexpr (is_sequence<T>::value) {
      for (std::size_t i = 0; i < v.size(); ++i) visit(v[i], join_path(path, std::to_string(i)));
    } else if constexpr (is_tuple<T>::value) {
      visit_tuple(v, path, std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (is_optional<T>::value) {
      if (v) visit(*v, path);
    } else if constexpr (has_fields<T>) {
      visit_struct(v, path);
    }
  }

  /// A sharded_tensor: one tensor leaf over its bytes (keyed by its path unless it has a key).
  template <class T>
  void visit_tensor(T& v, const std::string& path) {
    tensor_leaf leaf;
    leaf.path = path;
    leaf.sharding = static_cast<const tensor_sharding&>(v);
    if constexpr (!std::is_void_v<typename T::value_type>)
      leaf.sharding.type = dtype_of<typename T::value_type>;  // a typed tensor's dtype is T's
    if (leaf.sharding.key.empty()) leaf.sharding.key = path;
    auto raw = v.raw();
    leaf.data = raw.data();
    leaf.nbytes = raw.size();
    out.tensors.push_back(std::move(leaf));
  }

  /// A sharded_object: one object leaf that encodes and decodes its value with its codec.
  template <class T>
  void visit_object(T& v, const std::string& path) {
    using V = decltype(v.value);
    static_assert(encodable<V>,
                  "cairn: the value of a sharded_object must be encodable: trivially "
                  "copyable, std::string, std::vector of trivially copyable, or a type with "
                  "a cairn::codec specialization");
    object_leaf leaf;
    leaf.path = path;
    leaf.key = v.key.empty() ? path : v.key;
    leaf.global_shape = v.global_shape;
    leaf.global_offset = v.global_offset;
    leaf.replica_id = v.replica_id;
    leaf.value = &v.value;
    leaf.encode = [](const void* p) { return codec<V>::encode(*static_cast<const V*>(p)); };
    leaf.decode = [](std::span<const std::byte> in, void* p) {
      return codec<V>::decode(in, *static_cast<V*>(p));
    };
    out.objects.push_back(std::move(leaf));
  }

  /// A factory: the leaves of the state_dict it builds (kept alive with the leaves), and its
  /// merge step run after a load.
  void visit_factory(factory& v, const std::string& path);

  /// A state_dict: each entry in name order (nested dicts, common values, tensors, objects).
  void visit_state_dict(state_dict& v, const std::string& path);

  /// A state_dict's common value: loads replace it, but only by a value of the same kind (and
  /// dtype, unless a string).
  void visit_dict_common(common_value& e, const std::string& path);

  /// A type with an adapter: its view, visited in its place.
  template <class T>
  void visit_adapted(T& v, const std::string& path) {
    using view_t = decltype(adapter<T>::view(v));
    if constexpr (std::is_lvalue_reference_v<view_t>) {
      visit(adapter<T>::view(v), path);  // a reference into v: loads land in v itself
    } else {
      // A view by value (e.g. a sharded_tensor over v's memory) lives as long as the leaves.
      auto held = std::make_shared<std::remove_cvref_t<view_t>>(adapter<T>::view(v));
      out.keep_alive.push_back(held);
      visit(*held, path);
    }
  }

  /// A common value (scalar, string, vector of scalars): one common leaf.
  template <class T>
  void visit_common(T& v, const std::string& path) {
    common_leaf leaf;
    leaf.path = path;
    leaf.value = &v;
    leaf.encode = [](const void* p) { return common_value::of(*static_cast<const T*>(p)); };
    leaf.decode = [](const common_value& in, void* p) { return in.get(*static_cast<T*>(p)); };
    out.commons.push_back(std::move(leaf));
  }

  /// A string-keyed map: each value under its key, in key order.
  template <class T>
  void visit_string_map(T& v, const std::string& path) {
    if constexpr (is_unordered_map<T>::value) {
      // visit in sorted order so every rank lists leaves identically
      std::vector<std::pair<const std::string*, typename T::mapped_type*>> items;
      for (auto& [k, val] : v) items.emplace_back(&k, &val);
      std::sort(items.begin(), items.end(),
                [](const auto& a, const auto& b) { return *a.first < *b.first; });
      for (auto& [k, val] : items) visit(*val, join_path(path, *k));
    } else {
      for (auto& [k, val] : v) visit(val, join_path(path, k));
    }
  }

  /// A struct with field names: each named field, in declaration order.
  template <class T>
  void visit_struct(T& v, const std::string& path) {
    static_assert(std::is_aggregate_v<T>,
                  "cairn: a struct visited through its field names must be an aggregate "
                  "(Boost.PFR reflects aggregates only)");
    constexpr auto names = fields_of<T>::names;
    static_assert(names.size() == boost::pfr::tuple_size_v<T>,
                  "cairn: field_names(...) must list exactly one name per struct field, in "
                  "declaration order");
    visit_fields(v, path, std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
  }

  template <class T, std::size_t... I>
  void visit_tuple(T& v, const std::string& path, std::index_sequence<I...>) {
    (visit(std::get<I>(v), join_path(path, std::to_string(I))), ...);
  }

  template <class T, std::size_t... I>
  void visit_fields(T& v, const std::string& path, std::index_sequence<I...>) {
    constexpr auto names = fields_of<T>::names;
    (visit_field<T, I>(boost::pfr::get<I>(v), join_path(path, names[I])), ...);
  }

  template <class Parent, std::size_t I, class F>
  void visit_field(F& field, const std::string& path) {
    if constexpr (fields_of<Parent>::names[I].empty()) {
      return;  // "" marks a field that is not state
    } else {
      check_visitable<F, Parent, I>();
      visit_checked(field, path);
    }
  }
};

}  // namespace detail

/// Turns a state tree into its flat list of leaves. The leaves point into `tree`, which must
/// outlive the list. Common values are keyed by their path ("optim.step").
template <class Tree>
leaf_list flatten(Tree& tree) {
  leaf_list out;
  detail::flattener f{out};
  f.visit(tree, std::string());
  return out;
}

/// `flatten` of a `state_dict`, whose visit is compiled once (it is not a template: its
/// entries are the dynamically typed leaves).
CAIRN_INLINE leaf_list flatten(state_dict& tree);

/// True when cairn can visit a type at the top level of a tree.
template <class T>
inline constexpr bool visitable = detail::directly_visitable<std::remove_cvref_t<T>>;

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/tree/visit-inl.hpp"
#endif
