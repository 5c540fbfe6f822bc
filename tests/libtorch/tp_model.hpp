// A small tensor-parallel block for the libtorch tests: a column-parallel qkv Linear (rows
// split), a row-parallel proj Linear (columns split), a replicated LayerNorm and buffer. Each
// rank's module holds its piece of deterministic global tensors, so any rank count's pieces can
// be checked against the same global values.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "cairn/libtorch.hpp"

namespace cairn_test {

inline constexpr std::int64_t tp_width = 8, tp_hidden = 12;  // 12 splits over 1, 2, 3, 4 ranks

struct tp_blockImpl : torch::nn::Module {
  explicit tp_blockImpl(std::int64_t tp)
      : qkv(register_module("qkv", torch::nn::Linear(tp_width, tp_hidden / tp))),
        proj(register_module("proj", torch::nn::Linear(tp_hidden / tp, tp_width))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({tp_width})))) {
    pos = register_buffer("pos", torch::zeros({4, tp_width}));
  }
  torch::nn::Linear qkv;
  torch::nn::Linear proj;
  torch::nn::LayerNorm ln;
  torch::Tensor pos;
};
TORCH_MODULE(tp_block);

/// qkv split by rows, proj's weight by columns; the rest whole, written by tensor-parallel
/// rank 0.
inline cairn::libtorch::sharding tp_sharding(int tp_rank, int tp) {
  cairn::libtorch::sharding s(/*default_replica=*/tp_rank);
  s.split("qkv.*", 0, tp_rank, tp).split("proj.weight", 1, tp_rank, tp);
  return s;
}

/// The global value of the tensor `name` whose piece has shape `local` on `tp` ranks: distinct
/// per name, element and `seed`.
inline torch::Tensor global_value(const std::string& name,
                                  torch::IntArrayRef local,
                                  int tp,
                                  double seed) {
  std::vector<std::int64_t> shape(local.begin(), local.end());
  if (name.rfind("qkv.", 0) == 0) shape[0] *= tp;
  if (name == "proj.weight") shape[1] *= tp;
  double tag = static_cast<double>(std::hash<std::string>{}(name) % 1000);
  auto n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  return (torch::arange(n, torch::kDouble) * 0.01 + tag + seed).to(torch::kFloat).reshape(shape);
}

/// This rank's piece of a global tensor.
inline torch::Tensor piece(const std::string& name,
                           const torch::Tensor& global,
                           int tp_rank,
                           int tp) {
  if (name.rfind("qkv.", 0) == 0)
    return global.narrow(0, tp_rank * global.size(0) / tp, global.size(0) / tp);
  if (name == "proj.weight")
    return global.narrow(1, tp_rank * global.size(1) / tp, global.size(1) / tp);
  return global;
}

/// Sets every parameter and buffer of `m` to its piece of the global values.
inline void fill(tp_block& m, int tp_rank, int tp, double seed) {
  torch::NoGradGuard no_grad;
  for (auto& t : cairn::libtorch::named_tensors(*m))
    t.tensor.copy_(piece(t.name, global_value(t.name, t.tensor.sizes(), tp, seed), tp_rank, tp));
}

/// The names whose tensors in `m` are not their piece of the global values.
inline std::vector<std::string> mismatches(tp_block& m, int tp_rank, int tp, double seed) {
  std::vector<std::string> out;
  for (auto& t : cairn::libtorch::named_tensors(*m))
    if (!torch::equal(t.tensor,
                      piece(t.name, global_value(t.name, t.tensor.sizes(), tp, seed), tp_rank, tp)))
      out.push_back(t.name);
  return out;
}

/// One AdamW step of `m` with gradients that are each parameter's piece of global gradients
/// (seed `seed + 100`): elementwise, so the state is the piece of the global state.
inline void adamw_step(tp_block& m, torch::optim::AdamW& opt, int tp_rank, int tp, double seed) {
  for (auto& p : m->named_parameters())
    p.value().mutable_grad() =
        piece(p.key(), global_value(p.key(), p.value().sizes(), tp, seed + 100), tp_rank, tp);
  opt.step();
}

/// The tree each rank saves and loads: the block placed by `tp_sharding` and its AdamW state.
inline cairn::state_dict tp_state(tp_block& b, torch::optim::AdamW& opt, int tp_rank, int tp) {
  auto placing = tp_sharding(tp_rank, tp);
  cairn::state_dict sd;
  sd.add("model", cairn::libtorch::module_state(*b, placing));
  sd.add("optim", cairn::libtorch::optimizer_state(opt, *b, placing));
  return sd;
}

/// The names (`<param>`, `<param>.exp_avg`, ...) whose parameter or AdamW state in `m` and
/// `opt` is not its piece of the reference `ref_m` and `ref` (a one-rank block after the same
/// steps).
inline std::vector<std::string> loaded_mismatches(tp_block& m,
                                                  torch::optim::AdamW& opt,
                                                  tp_block& ref_m,
                                                  torch::optim::AdamW& ref,
                                                  int tp_rank,
                                                  int tp) {
  std::vector<std::string> out;
  auto ref_params = ref_m->named_parameters();
  for (auto& p : m->named_parameters()) {
    if (!torch::allclose(p.value(), piece(p.key(), ref_params[p.key()], tp_rank, tp), 1e-6, 1e-9))
      out.push_back(p.key());
    auto key = cairn::libtorch::optimizer_state_key(p.value());
    auto ref_key = cairn::libtorch::optimizer_state_key(ref_params[p.key()]);
    if (!opt.state().count(key)) {
      out.push_back(p.key() + " (no state)");
      continue;
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*opt.state()[key]);
    auto& r = static_cast<torch::optim::AdamWParamState&>(*ref.state()[ref_key]);
    if (s.step() != r.step()) out.push_back(p.key() + ".step");
    // Close, not equal: a vectorized loop may round a tensor's tail differently by its size.
    if (!torch::allclose(s.exp_avg(), piece(p.key(), r.exp_avg(), tp_rank, tp), 1e-6, 1e-9))
      out.push_back(p.key() + ".exp_avg");
    if (!torch::allclose(s.exp_avg_sq(), piece(p.key(), r.exp_avg_sq(), tp_rank, tp), 1e-6, 1e-9))
      out.push_back(p.key() + ".exp_avg_sq");
  }
  return out;
}

}  // namespace cairn_test
