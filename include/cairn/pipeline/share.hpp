// cairn/pipeline/share.hpp: pieces several ranks of a load want alike (data-parallel replicas of
// a tensor-parallel shard, a tensor every rank holds whole) are read from storage by one of them
// and passed on to the others through the communicator, instead of being read once per rank.
//
// Planning goes through the pieces' owners, so that no rank receives every rank's requests:
// each rank sends each piece it would read to the piece's owner (`piece_owner`: a hash of its key
// and box, so that the pieces of one big tensor spread over many owners); an owner groups the
// ranks that claimed the same piece, picks its reader (the least loaded by this owner's picks)
// and tells every member its place in a binomial tree rooted at the reader. Delivery runs the
// trees' rounds together: in round j every rank that holds a piece sends it to its child of round
// j, so a group of G ranks receives a piece in ceil(log2 G) rounds and no rank sends a piece
// more than once per round. Each round is cut into steps of at most
// `load_options::share_step_bytes` sent per rank (an all_to_all each), so the pieces are
// pipelined through bounded buffers rather than broadcast one at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/cuda/staging_window.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/options.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/tree/leaves.hpp"

namespace cairn::detail {

/// A tensor piece of this rank's tree: (tensor leaf, piece index).
using piece_ref = std::pair<std::size_t, std::size_t>;

/// One piece a rank would read that other ranks may want too, as it is sent to the piece's
/// owner: the key's position among the checkpoint's tensors (in key order, the same on every
/// rank), the type it is read as, and its box.
struct piece_claim {
  static constexpr std::string_view message_name = "piece claim";
  std::uint32_t key = 0;
  dtype type = dtype::f32;
  box region;
};

/// What a piece's owner tells a rank about one of its claims that other ranks share: which
/// claim (its position in what the rank sent this owner) and the rank's place in the tree that
/// delivers the piece from its reader.
struct piece_route {
  static constexpr std::string_view message_name = "piece route";
  std::uint32_t claim = 0;
  std::int32_t parent = -1;  ///< the rank it arrives from; -1: this rank reads it from storage
  std::uint8_t round = 0;    ///< the round it arrives in (when it has a parent)
  /// (round, rank): where this rank sends it on, each in a later round than it arrives
  std::vector<std::pair<std::uint8_t, std::int32_t>> children;
};

/// A piece this rank and at least one other want alike, as this rank sees it.
struct shared_piece {
  piece_ref local;  ///< this rank's (leaf, piece)
  std::uint64_t nbytes = 0;
  std::byte* data = nullptr;                  ///< where the piece lies in this rank's memory
  int parent = -1;                            ///< the rank it arrives from; -1: this rank reads it
  int round = 0;                              ///< the round it arrives in (when it has a parent)
  std::vector<std::pair<int, int>> children;  ///< (round, rank) it is sent on to
};

/// The hash a piece is known by: XXH3-64 of its key and box.
CAIRN_INLINE std::uint64_t piece_hash(std::string_view key, const box& b);

/// The rank that groups the claims on a piece: its hash modulo the world.
CAIRN_INLINE int piece_owner(std::string_view key, const box& b, int world);

/// An owner's verdict on the claims it received (`claims[r]`: rank r's, decoded): for each
/// piece claimed by at least two ranks (same key, type and box), a reader among them (the least
/// loaded by the bytes of this owner's earlier picks, from rank `first` on) and a binomial tree
/// rooted at it, members in rank order. Returns the routes for every rank (by rank).
CAIRN_INLINE std::vector<std::vector<piece_route>> route_claims(
    const std::vector<std::vector<piece_claim>>& claims, int first);

/// Finds the pieces this rank shares with other ranks, and its place in the tree of each,
/// without any rank receiving the others' requests: each rank sends every piece of at least
/// `opt.broadcast_min_bytes` of a key in `m` to the piece's owner (one all_to_all), the owners
/// route them (`route_claims`) and tell each rank its routes (a second all_to_all). A rank
/// receives the claims on the pieces it owns and a route per shared piece it wants. Collective;
/// empty when `opt.read_once_broadcast` is off, on one rank, or for `opt.common_only`.
CAIRN_INLINE std::vector<shared_piece> plan_shared_pieces(const leaf_list& leaves,
                                                          const checkpoint_metadata& m,
                                                          comm_ref comm,
                                                          const load_options& opt);

/// The pieces this rank does not read from storage: those it receives from another rank.
CAIRN_INLINE std::set<piece_ref> received_pieces(const std::vector<shared_piece>& shared);

/// Delivers the shared pieces along their trees, once every reader holds its pieces: the ranks
/// first agree on how many rounds and steps (9 bytes from every rank, with whether it is
/// `ready`), then each step is an all_to_all in which a rank sends each peer at most
/// `opt.share_step_bytes`. Returns false, delivering nothing, when some rank is not ready (a
/// reader may lack its pieces; that rank reports why); an error when a peer sent more or fewer
/// bytes than the routes say (naming it and the key). Adds what this rank sent and received to
/// `stats`. Collective: every rank runs every step, even after such an error. Pieces of leaves
/// `on_device` are read and written through `window`.
CAIRN_INLINE result<bool> deliver_shared_pieces(const std::vector<shared_piece>& shared,
                                                const leaf_list& leaves,
                                                comm_ref comm,
                                                const load_options& opt,
                                                bool ready,
                                                load_stats& stats,
                                                cuda::staging_window* window = nullptr);

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/share-inl.hpp"
#endif
