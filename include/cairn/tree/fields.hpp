// cairn/tree/fields.hpp: naming the fields of a user struct (Boost 1.81's PFR cannot reflect
// names, so the struct lists them).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace cairn {

/// The field names of a struct, in declaration order. An empty name ("") marks a field that
/// is not part of the saved state (a buffer the tensors view, a handle): it is never visited.
///
///     struct layer_state {
///       cairn::sharded_tensor<float> w;
///       cairn::sharded_tensor<float> b;
///       static constexpr auto fields = cairn::field_names("w", "b");
///     };
template <class... Names>
constexpr std::array<std::string_view, sizeof...(Names)> field_names(const Names&... names) {
  return {std::string_view(names)...};
}

/// Where cairn finds a struct's field names: `T::fields` by default. Specialize it for a type
/// you cannot edit:
///
///     template <> struct cairn::fields_of<their::adam_state> {
///       static constexpr auto names = cairn::field_names("exp_avg", "exp_avg_sq", "step");
///     };
template <class T>
struct fields_of {};

template <class T>
requires requires { T::fields; }
struct fields_of<T> {
  static constexpr auto names = T::fields;
};

/// The hook for types cairn cannot visit directly (a user's own tensor class, say).
/// Specialize it with `static auto view(T&)` returning something cairn can visit, visited in
/// T's place. A view returned by value (typically a `cairn::sharded_tensor<>` over the
/// tensor's memory) is kept alive while cairn uses it; tensor data loads into T's memory
/// through its span, but common values or objects inside a by-value view would load into the
/// copy, so return those by reference (`static cairn::sharded_object<X>& view(T&)`).
template <class T>
struct adapter {};

}  // namespace cairn
