// cairn/pipeline/load.hpp: the phases of a load. Read the metadata once (rank 0) and share it;
// select the leaves; stage device tensors; plan each rank's reads (plan/load_plan.hpp), read
// pieces every rank wants once and broadcast them; run the reads; agree on the outcome.
#pragma once

#include <array>
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

/// One piece a rank would read that another rank may want too: its key and its box (sent to
/// the key's owner).
struct wanted_piece {
  std::string key;
  box region;
};

/// What a key's owner tells each rank about a piece every rank wants alike: who reads it.
struct shared_verdict {
  static constexpr std::string_view message_name = "shared piece verdict";
  std::string key;
  box region;
  int reader = 0;
};

/// Rank 0 reads the metadata of whatever format is on `st` (native, torch_dist, safetensors)
/// and broadcasts it as JSON; every rank decodes the same bytes. Only a foreign format's
/// description may go without checksums.
CAIRN_INLINE result<checkpoint_metadata> read_metadata_collective(storage_ref st, comm_ref comm);

/// A tensor piece of this rank's tree: (tensor leaf, piece index).
using piece_ref = std::pair<std::size_t, std::size_t>;

/// Decodes the checkpoint's common values into the tree's common leaves, and hands the others
/// to `opt.client_state` when it is set.
CAIRN_INLINE result<void> load_commons(const leaf_list& leaves,
                                       storage_ref st,
                                       const checkpoint_metadata& m,
                                       const load_options& opt);

/// The checkpoint's record of tensor leaf `t`, after checking that dtype and shape match (a
/// padded target with `allow_shape_mismatch` is zeroed first).
CAIRN_INLINE result<const tensor_record*> matching_record(const tensor_leaf& t,
                                                          const checkpoint_metadata& m);

/// The copy jobs that fill this rank's tensor pieces (except those in `skip`).
CAIRN_INLINE result<std::vector<copy_job>> plan_tensor_copies(const leaf_list& leaves,
                                                              const checkpoint_metadata& m,
                                                              const std::set<piece_ref>& skip);

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
/// broadcast from another rank.
CAIRN_INLINE result<void> load_leaves_local(const leaf_list& leaves,
                                            storage_ref st,
                                            const checkpoint_metadata& m,
                                            const load_options& opt,
                                            load_stats& stats,
                                            const std::set<piece_ref>& skip = {},
                                            buffer_pool* pool = nullptr);

/// Checkpoint keys of every kind: tensor keys, object keys, common paths.
CAIRN_INLINE std::set<std::string> checkpoint_keys(const checkpoint_metadata& m);

/// Applies the strict mode: drops unexpected leaves, finds missing keys (collective for the
/// *_all modes: every rank's requested keys are gathered), logs or fails as the mode says.
CAIRN_INLINE result<void> apply_strict(leaf_list& leaves,
                                       const checkpoint_metadata& m,
                                       comm_ref comm,
                                       const load_options& opt,
                                       load_stats& stats);

/// One piece that every rank asks for alike: read by `reader`, broadcast to the rest.
struct shared_piece {
  piece_ref local;  ///< this rank's (leaf, piece)
  int reader = 0;
  std::uint64_t nbytes = 0;
  std::byte* data = nullptr;  ///< where the piece lies in this rank's memory
};

/// The hash a piece is known by in a `common_piece_filter`: XXH3-64 of its key and box.
CAIRN_INLINE std::uint64_t piece_hash(std::string_view key, const box& b);

/// A Bloom filter that holds every piece every rank wants (and, rarely, others), built without
/// any rank receiving the others' requests: the ranks agree on its size (16 bits per piece of
/// the rank that would share the most, a power of two; one 8-byte all_gather), each sets 3 bits
/// per piece it would share (`hashes`), sends segment r of its filter to rank r (all_to_all),
/// ANDs the segments it receives and all_gathers the result. Every rank receives about twice the
/// filter's bytes. Empty (on every rank alike) when some rank would share nothing. Collective.
CAIRN_INLINE bytes common_piece_filter(const std::vector<std::uint64_t>& hashes, comm_ref comm);

/// The 3 bit positions of hash `h` in a piece filter of `bits` bits (a power of two).
CAIRN_INLINE std::array<std::uint64_t, 3> piece_filter_bits(std::uint64_t h, std::uint64_t bits);

/// A rank's own piece filter of `bits` bits (a power of two): 3 bits set per hash.
CAIRN_INLINE bytes piece_filter_of(const std::vector<std::uint64_t>& hashes, std::uint64_t bits);

/// Whether `filter` may hold the piece hashed `h` (false for an empty filter).
CAIRN_INLINE bool filter_may_hold(std::span<const std::byte> filter, std::uint64_t h);

/// Finds the pieces every rank asks for whole and alike, and picks a reader for each, without
/// any rank receiving the others' requests: a `common_piece_filter` first drops the pieces not
/// every rank wants (with pipeline stages, or tensor-parallel shards, most of them), so that
/// ranks that want nothing shared exchange only the filter; then each rank sends each key's
/// owner (`owner_of`) its remaining pieces of that key (one all_to_all); the owner counts who wants
/// each piece and, for a piece every rank wants, picks a reader (the least loaded by its own picks,
/// itself first) and tells every rank (a second all_to_all). A rank receives the claims on the keys
/// it owns and a verdict per shared piece it wants. Collective; the result is in the same (key,
/// box) order on every rank.
CAIRN_INLINE std::vector<shared_piece> plan_shared_pieces(const leaf_list& leaves,
                                                          comm_ref comm,
                                                          const load_options& opt);

/// Broadcasts every shared piece from its reader into the other ranks' targets. Collective.
CAIRN_INLINE void broadcast_shared_pieces(const std::vector<shared_piece>& shared, comm_ref comm);

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
