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

#include <zstd.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/binary.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn {

/// The rank that plans key `key` among `world` ranks.
inline int owner_of(std::string_view key, int world) {
  return world <= 1 ? 0 : static_cast<int>(key_hash(key) % static_cast<std::uint64_t>(world));
}

namespace detail {

/// `b` compressed as one zstd frame (level 1): planning messages repeat keys and offsets.
inline bytes pack_message(std::span<const std::byte> b) {
  bytes out(ZSTD_compressBound(b.size()));
  std::size_t n = ZSTD_compress(out.data(), out.size(), b.data(), b.size(), 1);
  if (ZSTD_isError(n)) throw std::runtime_error("zstd: " + std::string(ZSTD_getErrorName(n)));
  out.resize(n);
  return out;
}

/// Inverse of pack_message; a message whose frame does not state its size, or states more than
/// `limit` bytes, is refused (messages come from other ranks of the same protocol).
inline bytes unpack_message(std::span<const std::byte> b, std::uint64_t limit = 1ull << 34) {
  if (b.empty()) return {};
  unsigned long long size = ZSTD_getFrameContentSize(b.data(), b.size());
  if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR || size > limit)
    throw std::length_error("planning message: bad zstd frame");
  bytes out(size);
  std::size_t n = ZSTD_decompress(out.data(), out.size(), b.data(), b.size());
  if (ZSTD_isError(n) || n != size) throw std::length_error("planning message: bad zstd frame");
  return out;
}

}  // namespace detail

/// Encodes the leaves `part` a rank sends one owner, with their indices among the rank's own
/// leaves (zstd-compressed).
inline bytes encode_claims(const rank_desc& part,
                           const std::vector<std::uint64_t>& tensor_leaf,
                           const std::vector<std::uint64_t>& object_leaf) {
  detail::binary_writer w;
  w.blob(encode(part));
  w.u64s(tensor_leaf);
  w.u64s(object_leaf);
  return detail::pack_message(w.data());
}

/// Splits a rank's description by owner: message `o` holds the leaves whose keys rank `o`
/// owns (`encode_claims`); empty when there are none. Common values are not sent (see
/// `scalable_plan`).
inline std::vector<bytes> claims_by_owner(const rank_desc& me, int world) {
  std::vector<rank_desc> part(static_cast<std::size_t>(world));
  std::vector<std::vector<std::uint64_t>> tensor_leaf(part.size()), object_leaf(part.size());
  for (std::size_t i = 0; i < me.tensors.size(); ++i) {
    auto o = static_cast<std::size_t>(owner_of(me.tensors[i].key, world));
    part[o].tensors.push_back(me.tensors[i]);
    tensor_leaf[o].push_back(i);
  }
  for (std::size_t i = 0; i < me.objects.size(); ++i) {
    auto o = static_cast<std::size_t>(owner_of(me.objects[i].key, world));
    part[o].objects.push_back(me.objects[i]);
    object_leaf[o].push_back(i);
  }
  std::vector<bytes> out(part.size());
  for (std::size_t o = 0; o < part.size(); ++o)
    if (!part[o].tensors.empty() || !part[o].objects.empty())
      out[o] = encode_claims(part[o], tensor_leaf[o], object_leaf[o]);
  return out;
}

/// What an owner decided about its keys.
struct owner_plan {
  save_index index;              ///< the owned keys: chunks with their writing ranks
  std::vector<bytes> to_writer;  ///< per rank, its slots of the owned keys (compressed)
};

namespace detail {

/// Every rank's claims as one description per sending rank, with leaf indices mapping each
/// position back to the sender's own leaf list.
struct received_claims {
  std::vector<rank_desc> ranks;
  std::vector<std::vector<std::uint64_t>> tensor_leaf, object_leaf;
};

inline received_claims decode_claims(const std::vector<bytes>& received) {
  received_claims c;
  c.ranks.resize(received.size());
  c.tensor_leaf.resize(received.size());
  c.object_leaf.resize(received.size());
  for (std::size_t r = 0; r < received.size(); ++r) {
    if (received[r].empty()) continue;
    bytes raw = unpack_message(received[r]);
    binary_reader rd(raw);
    c.ranks[r] = decode_rank_desc(rd.blob());
    c.tensor_leaf[r] = rd.u64s();
    c.object_leaf[r] = rd.u64s();
    if (c.tensor_leaf[r].size() != c.ranks[r].tensors.size() ||
        c.object_leaf[r].size() != c.ranks[r].objects.size())
      throw std::length_error("planning message: leaf lists disagree");
  }
  return c;
}

/// Encodes one writer's slots for the all_to_all back: per slot only the writer's leaf and
/// piece, and the element range of the piece it writes; the writer derives the rest from its
/// own leaves (`writer_index`).
inline bytes encode_slots(const save_index& L,
                          const std::vector<write_slot>& slots,
                          const received_claims& c,
                          int writer) {
  binary_writer w;
  w.u64(slots.size());
  auto r = static_cast<std::size_t>(writer);
  for (const write_slot& s : slots) {
    w.u8(s.is_object);
    w.u64(s.is_object ? c.object_leaf[r].at(s.leaf) : c.tensor_leaf[r].at(s.leaf));
    if (s.is_object) continue;
    const chunk_record& ch = L.tensors.at(s.key).chunks.at(s.chunk);
    // The writer rebuilds the region from the range: check here that it will get this one.
    const box& held = c.ranks[r].tensors.at(s.leaf).pieces.at(s.piece);
    auto again = flat_range_boxes(held, s.element, s.element + ch.region.volume());
    if (again.size() != 1 || again[0].region.offset != ch.region.offset ||
        again[0].region.size != ch.region.size)
      throw std::logic_error("scalable planning: a chunk of " + s.key +
                             " is not the box of its element range");
    w.u64(s.piece);
    w.i64(s.element);
    w.i64(ch.region.volume());
  }
  return pack_message(w.data());
}

/// Checks a slot's indices against the writer's own leaves (they come from another rank).
inline void check_slot(bool ok) {
  if (!ok) throw std::length_error("planning message: a slot names no leaf of this rank");
}

/// Adds one slot received from an owner to the writer's index `L` at `offset`, deriving its
/// record from the writer's own leaf.
inline void add_slot(binary_reader& rd,
                     const rank_desc& me,
                     int rank,
                     tiling tile,
                     std::uint64_t& offset,
                     save_index& L) {
  write_slot s;
  s.is_object = rd.u8();
  s.leaf = rd.u64();
  auto file = static_cast<std::uint32_t>(rank);
  if (s.is_object) {
    check_slot(s.leaf < me.objects.size());
    const object_desc& o = me.objects[s.leaf];
    s.key = object_unique_key(o.key, o.global_offset, o.global_shape);
    L.objects[s.key] =
        object_record{o.key, o.global_shape, o.global_offset, extent{file, offset, o.nbytes, {}}};
    offset += o.nbytes;
  } else {
    check_slot(s.leaf < me.tensors.size());
    const tensor_desc& t = me.tensors[s.leaf];
    s.key = t.key;
    s.piece = rd.u64();
    s.element = rd.i64();
    std::int64_t count = rd.i64();
    check_slot(s.piece < t.pieces.size() && s.element >= 0 && count > 0 &&
               count <= t.pieces[s.piece].volume() - s.element);
    auto region = flat_range_boxes(t.pieces[s.piece], s.element, s.element + count);
    check_slot(region.size() == 1);
    std::size_t es = dtype_size(t.type);
    std::uint64_t n = static_cast<std::uint64_t>(count) * es;
    tensor_record& rec = L.tensors[t.key];
    rec.type = t.type;
    rec.global_shape = t.global_shape;
    tile_counts tiles = tile
                            ? choose_tiles(region[0].region, es, L.block_size, t.global_shape, tile)
                            : tile_counts{};
    rec.chunks.push_back(chunk_record{region[0].region, extent{file, offset, n, {}}, tiles});
    s.chunk = rec.chunks.size() - 1;
    offset += n;
  }
  L.slots[static_cast<std::size_t>(rank)].push_back(std::move(s));
}

}  // namespace detail

/// The owner's part: decodes every rank's claims for the keys this rank owns, checks them
/// (`validate_integrity` when `validate`, otherwise only that no object is saved twice) and
/// plans them (`plan_save` with rotated ties). Errors name the key and the ranks, as
/// validate_integrity's do.
inline result<owner_plan> plan_owned(const std::vector<bytes>& received,
                                     bool validate,
                                     std::uint64_t block_size,
                                     std::uint64_t split_min_bytes,
                                     tiling tile) {
  detail::received_claims c = detail::decode_claims(received);
  if (validate)
    CAIRN_TRY(validate_integrity(c.ranks));
  else
    CAIRN_TRY(detail::check_unique_objects(c.ranks));
  owner_plan out;
  out.index = plan_save(c.ranks, block_size, split_min_bytes, tile, /*rotate=*/true);
  out.to_writer.resize(received.size());
  for (std::size_t r = 0; r < received.size(); ++r)
    if (!out.index.slots[r].empty())
      out.to_writer[r] =
          detail::encode_slots(out.index, out.index.slots[r], c, static_cast<int>(r));
  return out;
}

/// The writer's part: this rank's index from what every owner assigned it, with records taken
/// from this rank's own description `me` (tiled like `plan_save` when `tile`). It holds only the
/// chunks and objects this rank writes, in owner order, laid out one after the other; its
/// `slots` are empty except this rank's, and `bytes_of_rank` counts only this rank.
inline save_index writer_index(const std::vector<bytes>& from_owners,
                               const rank_desc& me,
                               int rank,
                               int world,
                               std::uint64_t block_size,
                               tiling tile) {
  save_index L;
  L.world_size = world;
  L.block_size = block_size;
  L.partial = true;
  L.slots.resize(static_cast<std::size_t>(world));
  L.bytes_of_rank.assign(static_cast<std::size_t>(world), 0);
  std::uint64_t offset = 0;
  for (const bytes& msg : from_owners) {
    if (msg.empty()) continue;
    bytes raw = detail::unpack_message(msg);
    detail::binary_reader rd(raw);
    for (std::uint64_t n = rd.u64(); n > 0; --n) detail::add_slot(rd, me, rank, tile, offset, L);
  }
  L.bytes_of_rank[static_cast<std::size_t>(rank)] = offset;
  return L;
}

}  // namespace cairn
