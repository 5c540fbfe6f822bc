// cairn/plan/scalable.hpp: the pure parts of save planning in which no rank receives or holds
// O(ranks × tensors); the collective that runs them is pipeline/scalable_plan.hpp.
//
// Every key has an owner, a rank picked by a hash of the key. Each rank sends every owner only
// the leaves with keys it owns (one all_to_all); each owner checks its keys across ranks
// (`validate_integrity` on what it received: the same checks, the same errors) and plans them
// (`plan_save`, ties rotated by key so that owners that each see a few keys still spread writes
// over every holder); each writer receives only its own slots (a second all_to_all) and lays
// its bytes out in owner order. Common values are compared against rank 0's list, which rank 0
// broadcasts (common values are few). Statuses meet at rank 0 (gather + broadcast), so every
// rank takes the same branch and reports the lowest failing rank's error.
//
// Per rank, traffic and state grow with that rank's leaves plus the leaves of the keys it owns
// (about total leaves / world); rank 0 adds a few bytes per rank for statuses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/plan/owner.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn {

namespace detail {

/// `b` compressed as one zstd frame (level 1): planning messages repeat keys and offsets.
CAIRN_INLINE bytes pack_message(std::span<const std::byte> b);

/// Inverse of pack_message; a message whose frame does not state its size, or states more than
/// `limit` bytes, is refused (messages come from other ranks of the same protocol).
CAIRN_INLINE bytes unpack_message(std::span<const std::byte> b, std::uint64_t limit = 1ull << 34);

}  // namespace detail

/// Encodes the leaves `part` a rank sends one owner, with their indices among the rank's own
/// leaves (zstd-compressed).
CAIRN_INLINE bytes encode_claims(const rank_desc& part,
                                 const std::vector<std::uint64_t>& tensor_leaf,
                                 const std::vector<std::uint64_t>& object_leaf);

/// Splits a rank's description by owner: message `o` holds the leaves whose keys rank `o`
/// owns (`encode_claims`); empty when there are none. Common values are not sent (see
/// `scalable_plan`).
CAIRN_INLINE std::vector<bytes> claims_by_owner(const rank_desc& me, int world);

/// What an owner decided about its keys.
struct owner_plan {
  save_index index;              ///< the owned keys: chunks with their writing ranks
  std::vector<bytes> to_writer;  ///< per rank, its slots of the owned keys (compressed)
};

namespace detail {

/// What a rank sends the owner of some of its keys: its leaves with those keys, and the
/// position of each in its own leaf lists (zstd-compressed on the wire).
struct claims_message {
  static constexpr std::string_view message_name = "planning claims";
  rank_desc part;
  std::vector<std::uint64_t> tensor_leaf, object_leaf;
};

/// An owner's assignment of one of the writer's objects (by its position in the writer's list).
struct object_slot_message {
  std::uint64_t leaf = 0;
};

/// An owner's assignment of a chunk of one of the writer's tensors: the leaf, the piece, and the
/// element range of the piece the chunk covers.
struct tensor_slot_message {
  std::uint64_t leaf = 0;
  std::uint64_t piece = 0;
  std::int64_t element = 0;
  std::int64_t count = 0;
};

/// One slot an owner assigns a writer: a chunk of a tensor, or an object.
using slot_message = std::variant<tensor_slot_message, object_slot_message>;

/// What an owner sends a writer: what it writes, in order (zstd-compressed on the wire).
struct slots_message {
  static constexpr std::string_view message_name = "planning slots";
  std::vector<slot_message> slots;
};

/// Every rank's claims as one description per sending rank, with leaf indices mapping each
/// position back to the sender's own leaf list.
struct received_claims {
  std::vector<rank_desc> ranks;
  std::vector<std::vector<std::uint64_t>> tensor_leaf, object_leaf;
};

CAIRN_INLINE received_claims decode_claims(const std::vector<bytes>& received);

/// Encodes one writer's slots for the all_to_all back: per slot only the writer's leaf and
/// piece, and the element range of the piece it writes; the writer derives the rest from its
/// own leaves (`writer_index`).
CAIRN_INLINE bytes encode_slots(const save_index& L,
                                const std::vector<write_slot>& slots,
                                const received_claims& c,
                                int writer);

/// Checks a slot's indices against the writer's own leaves (they come from another rank).
CAIRN_INLINE void check_slot(bool ok);

/// Adds one slot received from an owner to the writer's index `L` at `offset`, deriving its
/// record from the writer's own leaf.
CAIRN_INLINE void add_slot(const slot_message& slot,
                           const rank_desc& me,
                           int rank,
                           tiling tile,
                           std::uint64_t& offset,
                           save_index& L);

}  // namespace detail

/// The owner's part: decodes every rank's claims for the keys this rank owns, checks them
/// (`validate_integrity` when `validate`, otherwise only that no object is saved twice) and
/// plans them (`plan_save` with rotated ties). Errors name the key and the ranks, as
/// validate_integrity's do.
CAIRN_INLINE result<owner_plan> plan_owned(const std::vector<bytes>& received,
                                           bool validate,
                                           std::uint64_t block_size,
                                           std::uint64_t split_min_bytes,
                                           tiling tile);

/// The writer's part: this rank's index from what every owner assigned it, with records taken
/// from this rank's own description `me` (tiled like `plan_save` when `tile`). It holds only the
/// chunks and objects this rank writes, in owner order, laid out one after the other; its
/// `slots` are empty except this rank's, and `bytes_of_rank` counts only this rank.
CAIRN_INLINE save_index writer_index(const std::vector<bytes>& from_owners,
                                     const rank_desc& me,
                                     int rank,
                                     int world,
                                     std::uint64_t block_size,
                                     tiling tile);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/scalable-inl.hpp"
#endif
