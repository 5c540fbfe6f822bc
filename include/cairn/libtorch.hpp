// cairn/libtorch.hpp: everything for libtorch trainers (target cairn::torch): torch::Tensor
// leaves, torch::nn::Module, torch::optim state and learning-rate schedulers as state trees. See
// docs/libtorch.md.
#pragma once

#include "cairn/libtorch/module.hpp"
#include "cairn/libtorch/optim.hpp"
#include "cairn/libtorch/scheduler.hpp"
#include "cairn/libtorch/tensor.hpp"
