// cairn/libtorch.hpp: everything for libtorch trainers (target cairn::torch): torch::Tensor
// leaves, torch::nn::Module and torch::optim state as state trees. See docs/libtorch.md.
#pragma once

#include "cairn/libtorch/module.hpp"
#include "cairn/libtorch/optim.hpp"
#include "cairn/libtorch/tensor.hpp"
