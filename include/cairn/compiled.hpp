// cairn/compiled.hpp: the bodies of every non-template function of cairn's core, for separate
// compilation. The CMake target `cairn::compiled` builds libcairn.a from one translation unit
// that includes this header; without CMake, compile one source file of your own
//
//     #define CAIRN_SEPARATE_COMPILATION
//     #include <cairn/compiled.hpp>
//
// and build every other file that includes cairn with CAIRN_SEPARATE_COMPILATION defined too
// (mixing modes in one program breaks the one-definition rule). Each `X-inl.hpp` holds the
// bodies declared by `X.hpp`; in the default header-only mode, `X.hpp` includes it itself.
// The optional parts (comm/mpi.hpp, comm/nccl.hpp, storage/s3, libtorch) are header-only
// in both modes. The library registers every format reader and save strategy (torch_dist,
// safetensors): compiled once, they cost a program nothing to have, so with separate
// compilation every program reads and writes every format without including
// <cairn/strategies.hpp> (which still works, and is what header-only programs need).
#pragma once

#ifndef CAIRN_SEPARATE_COMPILATION
#  error "cairn/compiled.hpp builds cairn's compiled library: define CAIRN_SEPARATE_COMPILATION"
#endif

// Every reader and writer registers itself.
#include "cairn/strategies.hpp"

// The bodies.
#include "cairn/async/saver-inl.hpp"
#include "cairn/async/snapshot-inl.hpp"
#include "cairn/comm/agree-inl.hpp"
#include "cairn/comm/single-inl.hpp"
#include "cairn/comm/threads-inl.hpp"
#include "cairn/convert/diff-inl.hpp"
#include "cairn/convert/masters-inl.hpp"
#include "cairn/convert/source-inl.hpp"
#include "cairn/convert/unshard-inl.hpp"
#include "cairn/core/checksum-inl.hpp"
#include "cairn/core/common_value-inl.hpp"
#include "cairn/core/dtype-inl.hpp"
#include "cairn/core/error-inl.hpp"
#include "cairn/core/progress-inl.hpp"
#include "cairn/core/sharded_object-inl.hpp"
#include "cairn/core/sharded_tensor-inl.hpp"
#include "cairn/cuda/memory_resource-inl.hpp"
#include "cairn/cuda/staging_pool-inl.hpp"
#include "cairn/cuda/staging_window-inl.hpp"
#include "cairn/format/commit-inl.hpp"
#include "cairn/format/dcp/metadata-inl.hpp"
#include "cairn/format/dcp/reader-inl.hpp"
#include "cairn/format/dcp/source-inl.hpp"
#include "cairn/format/dcp/strategy-inl.hpp"
#include "cairn/format/dcp/stream_writer-inl.hpp"
#include "cairn/format/dcp/writer-inl.hpp"
#include "cairn/format/deepspeed/zero-inl.hpp"
#include "cairn/format/detail/format_util-inl.hpp"
#include "cairn/format/native/box_reader-inl.hpp"
#include "cairn/format/native/edit-inl.hpp"
#include "cairn/format/native/index_file-inl.hpp"
#include "cairn/format/native/metadata-inl.hpp"
#include "cairn/format/native/reader-inl.hpp"
#include "cairn/format/native/strategy-inl.hpp"
#include "cairn/format/native/stream_writer-inl.hpp"
#include "cairn/format/native/writer-inl.hpp"
#include "cairn/format/registry-inl.hpp"
#include "cairn/format/safetensors/file-inl.hpp"
#include "cairn/format/safetensors/files-inl.hpp"
#include "cairn/format/safetensors/reader-inl.hpp"
#include "cairn/format/safetensors/strategy-inl.hpp"
#include "cairn/format/safetensors/stream_writer-inl.hpp"
#include "cairn/format/save_strategy-inl.hpp"
#include "cairn/format/stream/slab-inl.hpp"
#include "cairn/format/stream/source-inl.hpp"
#include "cairn/format/stream/writers-inl.hpp"
#include "cairn/format/torch/pickle-inl.hpp"
#include "cairn/format/torch/state_dict-inl.hpp"
#include "cairn/format/torch/zip-inl.hpp"
#include "cairn/format/writers-inl.hpp"
#include "cairn/load-inl.hpp"
#include "cairn/manager/checkpointer-inl.hpp"
#include "cairn/manager/names-inl.hpp"
#include "cairn/manager/presets-inl.hpp"
#include "cairn/pipeline/keys-inl.hpp"
#include "cairn/pipeline/load-inl.hpp"
#include "cairn/pipeline/save-inl.hpp"
#include "cairn/pipeline/scalable_plan-inl.hpp"
#include "cairn/pipeline/share-inl.hpp"
#include "cairn/pipeline/stage-inl.hpp"
#include "cairn/plan/box-inl.hpp"
#include "cairn/plan/cover-inl.hpp"
#include "cairn/plan/index-inl.hpp"
#include "cairn/plan/load_plan-inl.hpp"
#include "cairn/plan/plan_cache-inl.hpp"
#include "cairn/plan/save_plan-inl.hpp"
#include "cairn/plan/scalable-inl.hpp"
#include "cairn/storage/buffer_pool-inl.hpp"
#include "cairn/storage/cached-inl.hpp"
#include "cairn/storage/detail/posix-inl.hpp"
#include "cairn/storage/fault_injection-inl.hpp"
#include "cairn/storage/file-inl.hpp"
#include "cairn/storage/memory-inl.hpp"
#include "cairn/storage/names-inl.hpp"
#include "cairn/storage/open-inl.hpp"
#include "cairn/storage/pointer-inl.hpp"
#include "cairn/storage/prefixed-inl.hpp"
#include "cairn/storage/storage-inl.hpp"
#include "cairn/storage/throttled-inl.hpp"
#include "cairn/storage/writer_slots-inl.hpp"
#include "cairn/tree/state_dict-inl.hpp"
#include "cairn/tree/visit-inl.hpp"
