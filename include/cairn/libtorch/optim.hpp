// cairn/libtorch/optim.hpp: the state of a torch::optim optimizer (Adam, AdamW, SGD, RMSprop,
// Adagrad) as a state tree keyed by parameter names (target cairn::torch).
//
//     state.add("optim", cairn::libtorch::optimizer_state(opt, *model, tp));  // like the params
//
// Keys: `state.<param>.<field>` for the state tensors (placed like their parameter, so they
// reshard with it), `state.<param>.step` and `param_groups.<i>.<option>` as common values;
// a mixed-precision run's fp32 masters as `state.<param>.fp32_param`.
#pragma once

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/libtorch/module.hpp"
#include "cairn/libtorch/tensor.hpp"
#include "cairn/tree/state_dict.hpp"

namespace cairn::libtorch {

/// The type libtorch files an optimizer's per-parameter state under: the address of the
/// parameter's TensorImpl as a string up to libtorch 1.13 (`c10::guts::to_string`), the address
/// itself (`void*`) since libtorch 2.
using optimizer_state_key_type = typename std::remove_cvref_t<
    decltype(std::declval<::torch::optim::Optimizer&>().state())>::key_type;

/// The key libtorch's optimizers file the state of parameter `p` under, in the form this
/// libtorch's `Optimizer::state()` map takes.
/// (A template only so that the branch of the other libtorch is never compiled.)
template <class Key = optimizer_state_key_type>
Key optimizer_state_key(const ::torch::Tensor& p) {
  c10::TensorImpl* impl = p.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    // What c10::guts::to_string(impl) printed: the pointer through an ostream.
    std::ostringstream key;
    key << impl;
    return key.str();
  } else {
    return impl;
  }
}

namespace detail {

/// One option of a parameter group, read and written as a common value.
struct group_option {
  std::string name;
  std::function<common_value()> get;
  std::function<result<void>(const common_value&)> set;
};

/// An option of type T read by `get()` and written by `set(T)`.
template <class Get, class Set>
group_option option(std::string name, Get get, Set set) {
  using T = std::remove_cvref_t<decltype(get())>;
  return {std::move(name), [get] { return common_value::of(get()); },
          [set](const common_value& v) -> result<void> {
            T x{};
            CAIRN_TRY(v.get(x));
            set(x);
            return ok();
          }};
}

/// Adam's and AdamW's (beta1, beta2), as a vector of two doubles.
template <class Options>
group_option betas_option(Options& o) {
  return {"betas",
          [&o] {
            auto [b1, b2] = o.betas();
            return common_value::of(std::vector<double>{b1, b2});
          },
          [&o](const common_value& v) -> result<void> {
            std::vector<double> b;
            CAIRN_TRY(v.get(b));
            if (b.size() != 2) return make_error(errc::mismatch, "betas needs two values");
            o.betas(std::make_tuple(b[0], b[1]));
            return ok();
          }};
}

// `o.name()` / `o.name(x)` as a group option.
#define CAIRN_TORCH_OPTION(o, name) \
  option(                           \
      #name, [&o] { return o.name(); }, [&o](auto x) { o.name(x); })

/// What cairn saves of one parameter's state: its tensors (by field name) and its step.
struct param_state_view {
  std::vector<std::pair<std::string, ::torch::Tensor>> tensors;
  std::int64_t* step = nullptr;
};

/// Adam's and AdamW's state of `p`, created as their first step creates it when missing.
template <class State, class Options>
param_state_view adam_state(::torch::optim::Optimizer& opt, const ::torch::Tensor& p, Options& o) {
  auto zeros = [&] { return ::torch::zeros_like(p, ::torch::MemoryFormat::Preserve); };
  auto& slot = opt.state()[optimizer_state_key(p)];
  if (!slot) {
    auto s = std::make_unique<State>();
    s->step(0);
    s->exp_avg(zeros());
    s->exp_avg_sq(zeros());
    slot = std::move(s);
  }
  auto& s = static_cast<State&>(*slot);
  param_state_view v{{{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}}, nullptr};
  if (o.amsgrad()) {
    if (!s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(zeros());
    v.tensors.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
  }
  v.step = &s.step();
  return v;
}

/// The state of `p` in `opt` (created when missing) and the options of its group, by the
/// optimizer's kind. Throws for optimizers cairn does not know (LBFGS, user-defined).
inline param_state_view param_state(::torch::optim::Optimizer& opt,
                                    const ::torch::Tensor& p,
                                    ::torch::optim::OptimizerOptions& base) {
  namespace optim = ::torch::optim;
  auto zeros = [&] { return ::torch::zeros_like(p, ::torch::MemoryFormat::Preserve); };
  // Fetched only once the optimizer is known to keep state for p (an empty slot would crash it).
  auto state_slot = [&]() -> std::unique_ptr<optim::OptimizerParamState>& {
    return opt.state()[optimizer_state_key(p)];
  };
  if (dynamic_cast<optim::AdamW*>(&opt))
    return adam_state<optim::AdamWParamState>(opt, p, static_cast<optim::AdamWOptions&>(base));
  if (dynamic_cast<optim::Adam*>(&opt))
    return adam_state<optim::AdamParamState>(opt, p, static_cast<optim::AdamOptions&>(base));
  if (dynamic_cast<optim::SGD*>(&opt)) {
    auto& o = static_cast<optim::SGDOptions&>(base);
    param_state_view v;
    if (o.momentum() == 0) return v;  // plain SGD keeps no state
    auto& slot = state_slot();
    if (!slot) {
      auto s = std::make_unique<optim::SGDParamState>();
      s->momentum_buffer(zeros());
      slot = std::move(s);
    }
    v.tensors.emplace_back("momentum_buffer",
                           static_cast<optim::SGDParamState&>(*slot).momentum_buffer());
    return v;
  }
  if (dynamic_cast<optim::RMSprop*>(&opt)) {
    auto& o = static_cast<optim::RMSpropOptions&>(base);
    auto& slot = state_slot();
    if (!slot) {
      auto s = std::make_unique<optim::RMSpropParamState>();
      s->step(0);
      s->square_avg(zeros());
      slot = std::move(s);
    }
    auto& s = static_cast<optim::RMSpropParamState&>(*slot);
    if (o.momentum() > 0 && !s.momentum_buffer().defined()) s.momentum_buffer(zeros());
    if (o.centered() && !s.grad_avg().defined()) s.grad_avg(zeros());
    param_state_view v{{{"square_avg", s.square_avg()}}, nullptr};
    if (o.momentum() > 0) v.tensors.emplace_back("momentum_buffer", s.momentum_buffer());
    if (o.centered()) v.tensors.emplace_back("grad_avg", s.grad_avg());
    v.step = &s.step();
    return v;
  }
  if (dynamic_cast<optim::Adagrad*>(&opt)) {
    auto& o = static_cast<optim::AdagradOptions&>(base);
    auto& slot = state_slot();
    if (!slot) {
      auto s = std::make_unique<optim::AdagradParamState>();
      s->step(0);
      s->sum(::torch::full_like(p, o.initial_accumulator_value(), ::torch::MemoryFormat::Preserve));
      slot = std::move(s);
    }
    auto& s = static_cast<optim::AdagradParamState&>(*slot);
    return {{{"sum", s.sum()}}, &s.step()};
  }
  throw exception(make_error(errc::invalid_argument,
                             "optimizer_state: only Adam, AdamW, SGD, RMSprop and Adagrad are "
                             "supported (LBFGS keeps history cairn cannot place over ranks)"));
}

/// The options of a parameter group that cairn saves, by the optimizer's kind.
inline std::vector<group_option> group_options(::torch::optim::Optimizer& opt,
                                               ::torch::optim::OptimizerOptions& base) {
  namespace optim = ::torch::optim;
  if (dynamic_cast<optim::AdamW*>(&opt)) {
    auto& o = static_cast<optim::AdamWOptions&>(base);
    return {CAIRN_TORCH_OPTION(o, lr), betas_option(o), CAIRN_TORCH_OPTION(o, eps),
            CAIRN_TORCH_OPTION(o, weight_decay), CAIRN_TORCH_OPTION(o, amsgrad)};
  }
  if (dynamic_cast<optim::Adam*>(&opt)) {
    auto& o = static_cast<optim::AdamOptions&>(base);
    return {CAIRN_TORCH_OPTION(o, lr), betas_option(o), CAIRN_TORCH_OPTION(o, eps),
            CAIRN_TORCH_OPTION(o, weight_decay), CAIRN_TORCH_OPTION(o, amsgrad)};
  }
  if (dynamic_cast<optim::SGD*>(&opt)) {
    auto& o = static_cast<optim::SGDOptions&>(base);
    return {CAIRN_TORCH_OPTION(o, lr), CAIRN_TORCH_OPTION(o, momentum),
            CAIRN_TORCH_OPTION(o, dampening), CAIRN_TORCH_OPTION(o, weight_decay),
            CAIRN_TORCH_OPTION(o, nesterov)};
  }
  if (dynamic_cast<optim::RMSprop*>(&opt)) {
    auto& o = static_cast<optim::RMSpropOptions&>(base);
    return {CAIRN_TORCH_OPTION(o, lr),       CAIRN_TORCH_OPTION(o, alpha),
            CAIRN_TORCH_OPTION(o, eps),      CAIRN_TORCH_OPTION(o, weight_decay),
            CAIRN_TORCH_OPTION(o, momentum), CAIRN_TORCH_OPTION(o, centered)};
  }
  if (dynamic_cast<optim::Adagrad*>(&opt)) {
    auto& o = static_cast<optim::AdagradOptions&>(base);
    return {CAIRN_TORCH_OPTION(o, lr), CAIRN_TORCH_OPTION(o, lr_decay),
            CAIRN_TORCH_OPTION(o, weight_decay), CAIRN_TORCH_OPTION(o, initial_accumulator_value),
            CAIRN_TORCH_OPTION(o, eps)};
  }
  return {};
}

#undef CAIRN_TORCH_OPTION

/// A leaf that saves `get()` as a common value at its own path and, after a load, hands the
/// loaded value to `set`: how a step or an option goes back into the optimizer.
inline factory common_factory(std::function<common_value()> get,
                              std::function<result<void>(const common_value&)> set) {
  return {[get = std::move(get)] {
            state_dict d;
            d.add("", get());
            return d;
          },
          [set = std::move(set)](state_dict& d) -> result<void> {
            const auto* v = std::get_if<common_value>(d.find(""));
            return v ? set(*v) : ok();
          }};
}

}  // namespace detail

/// How `optimizer_state` saves an optimizer beyond its state tensors, steps and options.
struct optimizer_state_options {
  /// The parameters `opt` updates are fp32 master weights of a lower-precision model (mixed
  /// precision; Megatron's main params, DeepSpeed's fp32 partitions): each is saved as
  /// `state.<name>.fp32_param` with its placement and loaded back into it, so a resumed run
  /// continues from the masters rather than from the rounded model, and `cairn unshard
  /// --fp32-masters` writes them under the model's keys. They must be F32.
  bool masters = false;
};

/// The state of `opt` as a tree over the parameters `params` names: each parameter the
/// optimizer updates must be among them (matched by identity). Its state tensors are saved as
/// `state.<name>.<field>` with the parameter's placement (a flat slice's placement for a
/// distributed optimizer's slices), its step as the common value `state.<name>.step`, and each
/// group's options as `param_groups.<i>.<option>`. State the optimizer has not created yet
/// (before its first step) is created as that step would, so a fresh optimizer can be loaded;
/// loading writes into the optimizer's own tensors and sets steps and options.
///
/// A common value must be equal on the ranks that declare it. A pipeline stage names its own
/// parameters: their steps are then held by the stage's ranks, saved once and loaded on
/// whichever ranks name those parameters (any number of stages); its groups' options must
/// match the other stages' groups of the same index. A distributed optimizer's rank that holds
/// none of a parameter passes an empty slice. With `how.masters` the parameters themselves
/// are saved too, as `state.<name>.fp32_param`.
inline factory optimizer_state(::torch::optim::Optimizer& opt,
                               std::vector<named_tensor> params,
                               optimizer_state_options how = {}) {
  // The parameters by identity; the handles in `params` keep their TensorImpls alive.
  auto named = std::make_shared<std::unordered_map<const void*, named_tensor>>();
  for (named_tensor& t : params) (*named)[t.tensor.unsafeGetTensorImpl()] = std::move(t);
  factory f;
  f.build = [&opt, named, how] {
    state_dict d;
    state_dict& states = d.child("state");
    state_dict& groups = d.child("param_groups");
    auto& param_groups = opt.param_groups();
    for (std::size_t g = 0; g < param_groups.size(); ++g) {
      auto& group = param_groups[g];
      state_dict& options = groups.child(std::to_string(g));
      for (auto& o : detail::group_options(opt, group.options()))
        options.add(o.name, detail::common_factory(std::move(o.get), std::move(o.set)));
      for (std::size_t i = 0; i < group.params().size(); ++i) {
        const ::torch::Tensor& p = group.params()[i];
        auto it = named->find(p.unsafeGetTensorImpl());
        if (it == named->end())
          throw exception(make_error(
              errc::invalid_argument,
              "optimizer_state: parameter " + std::to_string(i) + " of group " + std::to_string(g) +
                  " (shape " + c10::str(p.sizes()) + ") is not among the named tensors given"));
        const named_tensor& nt = it->second;
        detail::param_state_view v = detail::param_state(opt, p, group.options());
        if (v.tensors.empty() && !v.step) continue;
        state_dict& st = states.child(nt.name);
        for (auto& [field, t] : v.tensors) {
          placement place = nt.place;
          place.key.clear();  // keyed by path: state.<name>.<field>
          st.add(field, tensor(t, std::move(place)));
        }
        if (how.masters) {
          if (p.scalar_type() != ::torch::kFloat32)
            throw exception(make_error(errc::invalid_argument,
                                       "optimizer_state: masters must be F32; the parameter '" +
                                           nt.name + "' is " + c10::toString(p.scalar_type())));
          placement place = nt.place;
          place.key.clear();
          st.add("fp32_param", tensor(nt.tensor, std::move(place)));
        }
        if (std::int64_t* step = v.step)
          st.add("step",
                 detail::common_factory([step] { return common_value::of(*step); },
                                        [step](const common_value& c) { return c.get(*step); }));
      }
    }
    return d;
  };
  return f;
}

/// The state of `opt`, whose parameters are those of `m`, placed as `s` places them: each
/// state tensor reshards with its parameter.
inline factory optimizer_state(::torch::optim::Optimizer& opt,
                               const ::torch::nn::Module& m,
                               const sharding& s = sharding{}) {
  std::vector<named_tensor> params;
  for (const auto& item : m.named_parameters(/*recurse=*/true))
    params.push_back({item.key(), item.value(), s.place(item.key())});
  return optimizer_state(opt, std::move(params));
}

}  // namespace cairn::libtorch
