// A small Llama-architecture decoder in libtorch (RMSNorm, rotary position embeddings, a SwiGLU
// MLP; names, shapes and math as `transformers`' LlamaForCausalLM), tensor-parallel over MPI
// ranks in Megatron's layout: attention heads and the MLP's hidden units split over the
// tensor-parallel group, everything else replicated; and cut into pipeline stages: a stage
// holds a run of the decoder layers, the first also the embedding, the last the final norm and
// a copy of the embedding for the tied head. Used by gpt_trainer.cpp and bench/torch_bench.cpp.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cairn/libtorch.hpp"

namespace gpt {

/// The model's sizes (a Llama: `transformers`' LlamaConfig with these values, no biases,
/// tied embeddings, as many key/value heads as query heads).
struct config {
  std::int64_t vocab = 96, width = 48, heads = 4, layers = 2, context = 16;
  std::int64_t intermediate = 128;  ///< the MLP's hidden size
  double rope_theta = 10000.0, rms_norm_eps = 1e-5;
};

/// A tensor-parallel group: its communicator, this rank's place in it and its size.
struct tp_group {
  MPI_Comm comm = MPI_COMM_SELF;
  int rank = 0, size = 1;
};

/// A pipeline stage: this rank's stage `rank` of `size`, and the communicator of the ranks with
/// its tensor- and data-parallel place in every stage (ranked by stage).
struct pp_stage {
  MPI_Comm comm = MPI_COMM_SELF;
  int rank = 0, size = 1;
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
  /// The first decoder layer of this stage, of `layers` (the stage holds [begin, end)).
  std::int64_t begin(std::int64_t layers) const { return layers * rank / size; }
  std::int64_t end(std::int64_t layers) const { return layers * (rank + 1) / size; }
};

/// Sums `t` (contiguous) over `comm` in place; in float32 when `t` is of another dtype.
inline void allreduce_sum(torch::Tensor& t, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) return;
  if (t.scalar_type() != torch::kFloat32) {
    torch::Tensor wide = t.to(torch::kFloat32).contiguous();
    allreduce_sum(wide, comm);
    t.copy_(wide);
    return;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data_ptr<float>(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM,
                comm);
}

/// Megatron's `f`: identity forward, gradients summed over the tensor-parallel group backward
/// (the input of a column-parallel layer).
struct copy_to_tp : torch::autograd::Function<copy_to_tp> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x,
                               std::int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    torch::Tensor grad = g[0].contiguous().clone();
    allreduce_sum(grad, MPI_Comm_f2c(static_cast<MPI_Fint>(ctx->saved_data["comm"].toInt())));
    return {grad, torch::Tensor()};
  }
};

/// Megatron's `g`: partial results summed over the group forward, identity backward (the
/// output of a row-parallel layer).
struct reduce_from_tp : torch::autograd::Function<reduce_from_tp> {
  static torch::Tensor forward(torch::autograd::AutogradContext*,
                               torch::Tensor x,
                               std::int64_t comm) {
    torch::Tensor y = x.contiguous().clone();
    allreduce_sum(y, MPI_Comm_f2c(static_cast<MPI_Fint>(comm)));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return {g[0], torch::Tensor()};
  }
};

/// Llama's RMSNorm: x / sqrt(mean(x^2) + eps) * weight, the normalization in float32 whatever
/// x's dtype (as `transformers` computes it).
struct rms_normImpl : torch::nn::Module {
  rms_normImpl(std::int64_t width, double eps)
      : eps(eps), weight(register_parameter("weight", torch::ones({width}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor wide = x.to(torch::kFloat32);
    return weight *
           (wide * torch::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
  }
  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(rms_norm);

/// cos and sin of the rotary position embedding for positions [0, T): [T, head_dim] each, the
/// frequencies repeated twice as `transformers` lays them out.
inline std::pair<torch::Tensor, torch::Tensor> rotary(std::int64_t T,
                                                      std::int64_t head_dim,
                                                      double theta) {
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kFloat) /
                                                       static_cast<double>(head_dim));
  torch::Tensor freqs = torch::outer(torch::arange(T, torch::kFloat), inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

/// x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] of x's two halves; cos and sin
/// in x's dtype.
inline torch::Tensor apply_rotary(const torch::Tensor& x,
                                  const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

/// A linear layer without bias (Llama has none).
inline torch::nn::Linear linear(std::int64_t in, std::int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

/// Causal self-attention with rotary embeddings; q, k and v hold this rank's heads
/// (column-parallel), o this rank's columns (row-parallel).
struct attentionImpl : torch::nn::Module {
  attentionImpl(const config& c, const tp_group& tp)
      : heads(c.heads / tp.size),
        head_dim(c.width / c.heads),
        theta(c.rope_theta),
        comm(MPI_Comm_c2f(tp.comm)),
        q_proj(register_module("q_proj", linear(c.width, c.width / tp.size))),
        k_proj(register_module("k_proj", linear(c.width, c.width / tp.size))),
        v_proj(register_module("v_proj", linear(c.width, c.width / tp.size))),
        o_proj(register_module("o_proj", linear(c.width / tp.size, c.width))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1);
    torch::Tensor h = copy_to_tp::apply(x, comm);
    auto split = [&](torch::Tensor t) { return t.view({B, T, heads, head_dim}).transpose(1, 2); };
    auto [cos, sin] = rotary(T, head_dim, theta);
    torch::Tensor q = apply_rotary(split(q_proj(h)), cos, sin);
    torch::Tensor k = apply_rotary(split(k_proj(h)), cos, sin);
    torch::Tensor att =
        torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    att = att.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY).softmax(-1);
    torch::Tensor y = torch::matmul(att, split(v_proj(h))).transpose(1, 2).reshape({B, T, -1});
    return reduce_from_tp::apply(o_proj(y), comm);
  }

  std::int64_t heads, head_dim;
  double theta;
  std::int64_t comm;
  torch::nn::Linear q_proj, k_proj, v_proj, o_proj;
};
TORCH_MODULE(attention);

/// The SwiGLU MLP: down(silu(gate(x)) * up(x)); gate and up hold this rank's rows, down its
/// columns.
struct mlpImpl : torch::nn::Module {
  mlpImpl(const config& c, const tp_group& tp)
      : comm(MPI_Comm_c2f(tp.comm)),
        gate_proj(register_module("gate_proj", linear(c.width, c.intermediate / tp.size))),
        up_proj(register_module("up_proj", linear(c.width, c.intermediate / tp.size))),
        down_proj(register_module("down_proj", linear(c.intermediate / tp.size, c.width))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = copy_to_tp::apply(x, comm);
    return reduce_from_tp::apply(down_proj(torch::silu(gate_proj(h)) * up_proj(h)), comm);
  }

  std::int64_t comm;
  torch::nn::Linear gate_proj, up_proj, down_proj;
};
TORCH_MODULE(mlp);

/// One decoder layer, pre-norm, named as `transformers`' LlamaDecoderLayer.
struct blockImpl : torch::nn::Module {
  blockImpl(const config& c, const tp_group& tp)
      : input_layernorm(register_module("input_layernorm", rms_norm(c.width, c.rms_norm_eps))),
        self_attn(register_module("self_attn", attention(c, tp))),
        post_attention_layernorm(
            register_module("post_attention_layernorm", rms_norm(c.width, c.rms_norm_eps))),
        mlp_(register_module("mlp", mlp(c, tp))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + self_attn(input_layernorm(x));
    return x + mlp_(post_attention_layernorm(x));
  }

  rms_norm input_layernorm;
  attention self_attn;
  rms_norm post_attention_layernorm;
  mlp mlp_;
};
TORCH_MODULE(block);

/// The token embedding, the decoder layers, a final norm and a head tied to the embedding; its
/// parameters are named as LlamaForCausalLM's under `model.` (the trainer's tree adds it). A
/// pipeline stage holds its layers (named by their place in the whole model), the first stage
/// the embedding, the last the norm and the embedding again (the tied head's weight).
struct modelImpl : torch::nn::Module {
  modelImpl(const config& c, const tp_group& tp, const pp_stage& pp = {}) {
    if (pp.first() || pp.last())
      embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.width));
    layers = register_module("layers", torch::nn::ModuleDict());
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> mine;
    for (std::int64_t i = pp.begin(c.layers); i < pp.end(c.layers); ++i)
      mine.emplace_back(std::to_string(i), block(c, tp).ptr());
    layers->update(mine);
    if (pp.last()) norm = register_module("norm", rms_norm(c.width, c.rms_norm_eps));
  }

  /// Logits [B, T, vocab] of tokens [B, T] (the whole model: one stage).
  torch::Tensor forward(torch::Tensor idx) { return head(blocks(embed(idx))); }
  /// The first stage's part: token embeddings [B, T, width] of tokens [B, T].
  torch::Tensor embed(const torch::Tensor& idx) { return embed_tokens(idx); }
  /// This stage's decoder layers over hidden states [B, T, width].
  torch::Tensor blocks(torch::Tensor x) {
    for (const auto& item : layers->items()) x = item.second->as<block>()->forward(x);
    return x;
  }
  /// The last stage's part: logits [B, T, vocab] of hidden states [B, T, width].
  torch::Tensor head(const torch::Tensor& x) {
    return torch::matmul(norm(x), embed_tokens->weight.t());
  }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleDict layers{nullptr};
  rms_norm norm{nullptr};
};
TORCH_MODULE(model);

/// How the model's tensors sit over the ranks: q, k, v, gate and up split by rows (axis 0), o
/// and down by columns (axis 1), written by data-parallel rank 0; the rest whole, written by
/// tensor- and data-parallel rank 0 of the stage that holds them. The last stage's copy of the
/// embedding (`tied_copy`, pipelines of two or more stages) is never written: the first
/// stage's is.
inline cairn::libtorch::sharding model_sharding(const tp_group& tp,
                                                int dp_rank,
                                                bool tied_copy = false) {
  cairn::libtorch::sharding s(/*default_replica=*/tp.rank + tp.size * dp_rank);
  if (tied_copy) s.replicate("embed_tokens.weight", 1 + tp.rank + tp.size * dp_rank);
  for (const char* rows :
       {"*.q_proj.*", "*.k_proj.*", "*.v_proj.*", "*.gate_proj.*", "*.up_proj.*"})
    s.split(rows, 0, tp.rank, tp.size, dp_rank);
  for (const char* cols : {"*.o_proj.weight", "*.down_proj.weight"})
    s.split(cols, 1, tp.rank, tp.size, dp_rank);
  return s;
}

}  // namespace gpt
