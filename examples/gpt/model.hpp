// A small GPT in libtorch, tensor-parallel over MPI ranks (Megatron's layout): attention heads
// and the MLP's hidden units split over the tensor-parallel group, everything else replicated.
// Used by gpt_trainer.cpp and bench/torch_bench.cpp.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/libtorch.hpp"

namespace gpt {

/// The model's sizes.
struct config {
  std::int64_t vocab = 96, width = 48, heads = 4, layers = 2, context = 16;
};

/// A tensor-parallel group: its communicator, this rank's place in it and its size.
struct tp_group {
  MPI_Comm comm = MPI_COMM_SELF;
  int rank = 0, size = 1;
};

/// Sums `t` (float, contiguous) over `comm` in place.
inline void allreduce_sum(torch::Tensor& t, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) return;
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

/// One transformer block; q, k, v and fc1 hold this rank's rows (column-parallel), proj and fc2
/// this rank's columns (row-parallel; their biases are added once, after the sum).
struct blockImpl : torch::nn::Module {
  blockImpl(const config& c, const tp_group& tp)
      : heads(c.heads / tp.size),
        head_dim(c.width / c.heads),
        comm(MPI_Comm_c2f(tp.comm)),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        q(register_module("q", torch::nn::Linear(c.width, c.width / tp.size))),
        k(register_module("k", torch::nn::Linear(c.width, c.width / tp.size))),
        v(register_module("v", torch::nn::Linear(c.width, c.width / tp.size))),
        proj(register_module("proj", torch::nn::Linear(c.width / tp.size, c.width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        fc1(register_module("fc1", torch::nn::Linear(c.width, 4 * c.width / tp.size))),
        fc2(register_module("fc2", torch::nn::Linear(4 * c.width / tp.size, c.width))) {}

  torch::Tensor forward(torch::Tensor x) {
    const auto B = x.size(0), T = x.size(1);
    torch::Tensor h = copy_to_tp::apply(ln1(x), comm);
    auto split = [&](torch::Tensor t) { return t.view({B, T, heads, head_dim}).transpose(1, 2); };
    torch::Tensor att = torch::matmul(split(q(h)), split(k(h)).transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(head_dim));
    att = att.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY).softmax(-1);
    torch::Tensor y = torch::matmul(att, split(v(h))).transpose(1, 2).reshape({B, T, -1});
    x = x + reduce_from_tp::apply(torch::nn::functional::linear(y, proj->weight), comm) +
        proj->bias;
    h = copy_to_tp::apply(ln2(x), comm);
    h = torch::gelu(fc1(h));
    return x + reduce_from_tp::apply(torch::nn::functional::linear(h, fc2->weight), comm) +
           fc2->bias;
  }

  std::int64_t heads, head_dim, comm;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear q, k, v, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(block);

/// Token and position embeddings, the blocks, a final layer norm and a head tied to the token
/// embedding.
struct modelImpl : torch::nn::Module {
  modelImpl(const config& c, const tp_group& tp)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab, c.width))),
        wpe(register_module("wpe", torch::nn::Embedding(c.context, c.width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(
            register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))) {
    for (std::int64_t i = 0; i < c.layers; ++i) blocks->push_back(block(c, tp));
  }

  /// Logits [B, T, vocab] of tokens [B, T].
  torch::Tensor forward(torch::Tensor idx) {
    torch::Tensor x = wte(idx) + wpe(torch::arange(idx.size(1)));
    for (const auto& b : *blocks) x = b->as<block>()->forward(x);
    return torch::matmul(ln_f(x), wte->weight.t());
  }

  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
};
TORCH_MODULE(model);

/// How the model's tensors sit over the ranks: q, k, v, fc1 split by rows (axis 0), proj and
/// fc2 weights by columns (axis 1), written by data-parallel rank 0; the rest whole, written by
/// global rank 0 (tensor- and data-parallel rank 0).
inline cairn::libtorch::sharding model_sharding(const tp_group& tp, int dp_rank) {
  cairn::libtorch::sharding s(/*default_replica=*/tp.rank + tp.size * dp_rank);
  for (const char* rows : {"*.q.*", "*.k.*", "*.v.*", "*.fc1.*"})
    s.split(rows, 0, tp.rank, tp.size, dp_rank);
  for (const char* cols : {"*.proj.weight", "*.fc2.weight"})
    s.split(cols, 1, tp.rank, tp.size, dp_rank);
  return s;
}

}  // namespace gpt
