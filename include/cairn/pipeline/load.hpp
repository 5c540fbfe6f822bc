// cairn/pipeline/load.hpp: the phases of a load. Read the metadata once (rank 0) and share it;
// select the leaves; stage device tensors; plan each rank's reads (plan/load_plan.hpp) and which
// pieces several ranks share (pipeline/share.hpp); run the reads; pass the shared pieces on;
// agree on the outcome.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/box_reader.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/options.hpp"
#include "cairn/pipeline/keys.hpp"
#include "cairn/pipeline/share.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/load_plan.hpp"
#include "cairn/storage/buffer_pool.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// What rank 0 tells every rank about a checkpoint's metadata: the native JSON (translated from
/// a foreign format's, when `foreign`).
struct metadata_message {
  static constexpr std::string_view message_name = "checkpoint metadata";
  bool foreign = false;
  std::string json;
};

/// Rank 0 reads the metadata of whatever format is on `st` (native, torch_dist, safetensors)
/// and broadcasts it as JSON; every rank decodes the same bytes. Only a foreign format's
/// description may go without checksums.
CAIRN_INLINE result<checkpoint_metadata> read_metadata_collective(storage_ref st, comm_ref comm);

/// Decodes the checkpoint's common values into the tree's common leaves, and hands the others
/// to `opt.client_state` when it is set.
CAIRN_INLINE result<void> load_commons(const leaf_list& leaves,
                                       storage_ref st,
                                       const checkpoint_metadata& m,
                                       const load_options& opt);

/// The checkpoint's record of tensor leaf `t`, after checking that dtype and shape match (a
/// padded target with `allow_shape_mismatch` is zeroed first). With `cast_floats`, a saved
/// floating dtype that differs from a floating target is accepted (the copies convert it).
CAIRN_INLINE result<const tensor_record*> matching_record(const tensor_leaf& t,
                                                          const checkpoint_metadata& m,
                                                          bool cast_floats = false);

/// The copy jobs that fill this rank's tensor pieces (except those in `skip`); with
/// `cast_floats`, jobs of a floating tensor saved in another floating dtype convert it, and its
/// key is added to `cast` (once).
CAIRN_INLINE result<std::vector<copy_job>> plan_tensor_copies(
    const leaf_list& leaves,
    const checkpoint_metadata& m,
    const std::set<piece_ref>& skip,
    bool cast_floats = false,
    std::vector<std::string>* cast = nullptr);

/// The saved object a sharded object leaf loads: the same grid position, or on a changed grid
/// the one `object_mapping` picks. Null: the mapping chose to leave the value as it is.
CAIRN_INLINE result<const object_record*> find_saved_object(const object_leaf& o,
                                                            const checkpoint_metadata& m,
                                                            const load_options& opt);

/// Reads and decodes this rank's sharded objects; hands the bytes of the objects whose keys the
/// tree does not load to `opt.client_objects` when it is set.
CAIRN_INLINE result<void> load_objects(const leaf_list& leaves,
                                       storage_ref st,
                                       const checkpoint_metadata& m,
                                       const load_options& opt,
                                       load_stats& stats);

/// Loads this rank's leaves from already-read metadata. Pieces in `skip` are left for a
/// broadcast from another rank. Leaves `on_device` are copied to the device through `window`.
CAIRN_INLINE result<void> load_leaves_local(const leaf_list& leaves,
                                            storage_ref st,
                                            const checkpoint_metadata& m,
                                            const load_options& opt,
                                            load_stats& stats,
                                            const std::set<piece_ref>& skip = {},
                                            buffer_pool* pool = nullptr,
                                            cuda::staging_window* window = nullptr);

/// Checkpoint keys of every kind: tensor keys, object keys, common paths.
CAIRN_INLINE std::set<std::string> checkpoint_keys(const checkpoint_metadata& m);

/// Applies the strict mode: drops unexpected leaves, finds missing keys (collective for the
/// *_all modes: every rank's requested keys are gathered), logs or fails as the mode says.
CAIRN_INLINE result<void> apply_strict(leaf_list& leaves,
                                       const checkpoint_metadata& m,
                                       comm_ref comm,
                                       const load_options& opt,
                                       load_stats& stats);

/// The outcome of a load step on every rank: the failure of the lowest failing rank, tagged
/// with that rank, on every rank alike (as a save reports it), so that every rank takes the
/// same branch on the error's code. Collective.
CAIRN_INLINE result<void> agree_on_load(comm_ref comm, const std::optional<error>& failure);

/// A load after the metadata is known (collective): select the leaves, apply the strict mode,
/// stage device tensors, read this rank's pieces, broadcast the pieces read once, run the
/// after-load merges; every rank learns every rank's outcome.
CAIRN_INLINE result<void> load_leaves_from(const leaf_list& tree_leaves,
                                           checkpoint_metadata& m,
                                           storage_ref st,
                                           comm_ref comm,
                                           const load_options& opt,
                                           load_stats& stats);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/load-inl.hpp"
#endif
