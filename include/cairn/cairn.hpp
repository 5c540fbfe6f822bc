// cairn/cairn.hpp: the whole core library in one include.
//
// Optional parts (MPI, CUDA, NCCL, S3) have their own headers and CMake targets. The
// torch_dist and safetensors strategies, and loading PyTorch DCP and safetensors checkpoints,
// come with <cairn/strategies.hpp> (it brings the pickle, ZIP and safetensors parsers, which
// every file including this header would otherwise compile).
#pragma once

#include "cairn/async/saver.hpp"
#include "cairn/comm/communicator.hpp"
#include "cairn/comm/single.hpp"
#include "cairn/comm/threads.hpp"
#include "cairn/core/codec.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/local_non_persistent.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/format/native/edit.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/load.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "cairn/manager/presets.hpp"
#include "cairn/options.hpp"
#include "cairn/plan/plan_cache.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/open.hpp"
#include "cairn/storage/prefixed.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/fields.hpp"
#include "cairn/tree/state_dict.hpp"
#include "cairn/tree/visit.hpp"
