// cairn/strategies.hpp: every save strategy besides the native format, and the readers of every
// foreign format: `torch_dist` (PyTorch Distributed Checkpoint + Megatron's files,
// format/dcp/strategy.hpp) and the safetensors formats (`one_file`, `per_tensor`, `chunks`,
// format/safetensors/strategy.hpp). Including it registers them by format id
// (`make_save_strategy("torch_dist")`), and `load` reads all of them back on any number of
// ranks.
#pragma once

#include "cairn/format/dcp/strategy.hpp"
#include "cairn/format/foreign.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/format/safetensors/strategy.hpp"
#include "cairn/save.hpp"
