// cairn/libtorch/module.hpp: a torch::nn::Module as a state tree, its parameters and buffers
// placed over ranks by rules on their names (target cairn::torch).
//
//     cairn::libtorch::sharding tp(dp_rank);                // unmatched: whole, replica dp_rank
//     tp.split("*.attn.qkv.*", 0, tp_rank, tp_size, dp_rank)  // column-parallel: rows split
//       .split("*.attn.proj.weight", 1, tp_rank, tp_size, dp_rank);  // row-parallel: columns
//     state.add("model", cairn::libtorch::module_state(*model, tp));
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/libtorch/tensor.hpp"
#include "cairn/tree/state_dict.hpp"

namespace cairn::libtorch {

/// Whether `name` matches the glob `pattern`: `*` matches any run of characters (dots too),
/// `?` any one character, everything else itself.
inline bool name_matches(std::string_view pattern, std::string_view name) noexcept {
  std::size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

/// How the tensors of a module are placed over ranks: rules on their names, tried in the order
/// they were added (the first match wins). A module written for one rank whose layers hold
/// tensor-parallel pieces becomes a sharded state tree: each rule says which axis of the global
/// tensor the local piece splits and which piece this rank holds.
class sharding {
 public:
  /// Tensors no rule matches are whole on every rank; `default_replica` 0 marks the rank that
  /// writes them (pass the data-parallel rank, or the global rank).
  explicit sharding(int default_replica = 0) : default_replica_(default_replica) {}

  /// Tensors matching `pattern` are this rank's piece `index` of `count` equal pieces along
  /// global axis `axis`; `replica_id` 0 on the ranks that write them (the data-parallel rank).
  sharding& split(
      std::string pattern, int axis, std::int64_t index, std::int64_t count, int replica_id = 0) {
    rules_.push_back({std::move(pattern), rule_kind::split, {{axis, index, count}}, replica_id});
    return *this;
  }
  /// Tensors matching `pattern` are whole on every rank; `replica_id` 0 on the one that writes.
  sharding& replicate(std::string pattern, int replica_id) {
    rules_.push_back({std::move(pattern), rule_kind::replicate, {}, replica_id});
    return *this;
  }
  /// Tensors matching `pattern` are left out of the tree: never saved, never loaded (caches,
  /// masks and other buffers rebuilt by the model).
  sharding& skip(std::string pattern) {
    rules_.push_back({std::move(pattern), rule_kind::skip, {}, 0});
    return *this;
  }

  /// Whether the tensor called `name` is left out.
  bool skips(std::string_view name) const noexcept {
    const rule* r = find(name);
    return r && r->kind == rule_kind::skip;
  }
  /// The placement of the tensor called `name` (key empty: its path in the tree).
  placement place(std::string_view name) const {
    placement p;
    p.replica_id = default_replica_;
    if (const rule* r = find(name)) {
      p.splits = r->splits;
      p.replica_id = r->replica_id;
    }
    return p;
  }

 private:
  enum class rule_kind { split, replicate, skip };
  struct rule {
    std::string pattern;
    rule_kind kind;
    std::vector<axis_split> splits;
    int replica_id;
  };
  const rule* find(std::string_view name) const noexcept {
    for (const rule& r : rules_)
      if (name_matches(r.pattern, name)) return &r;
    return nullptr;
  }
  std::vector<rule> rules_;
  int default_replica_;
};

/// A tensor with its name and placement: one parameter or buffer of a module, or one
/// parameter (or flat slice of one) an optimizer updates.
struct named_tensor {
  std::string name;        ///< the name under which it is saved ("layers.0.attn.qkv.weight")
  ::torch::Tensor tensor;  ///< the tensor itself (a shared handle: loads land in it)
  placement place;         ///< where its block sits in the global tensor
};

/// The named tensors of `m` (parameters, then buffers; recursive, named as
/// `Module::named_parameters` names them) that `s` does not skip, with their placements.
inline std::vector<named_tensor> named_tensors(const ::torch::nn::Module& m,
                                               const sharding& s = sharding{}) {
  std::vector<named_tensor> out;
  auto take = [&](const auto& dict) {
    for (const auto& item : dict)
      if (!s.skips(item.key())) out.push_back({item.key(), item.value(), s.place(item.key())});
  };
  take(m.named_parameters(/*recurse=*/true));
  take(m.named_buffers(/*recurse=*/true));
  return out;
}

/// The parameters and buffers of `m` as a state tree: one tensor leaf per name, placed by `s`,
/// loading in place into the module's own tensors. Put it under a name in a larger tree
/// (`state.add("model", module_state(*model, tp))`): keys are then `model.<parameter name>`.
inline state_dict module_state(const ::torch::nn::Module& m, const sharding& s = sharding{}) {
  state_dict d;
  for (named_tensor& t : named_tensors(m, s))
    d.add(std::move(t.name), tensor(std::move(t.tensor), std::move(t.place)));
  return d;
}

}  // namespace cairn::libtorch
