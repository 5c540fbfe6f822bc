// cairn/plan/scalable.hpp: save planning in which no rank receives or holds O(ranks × tensors).
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
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/comm/agree.hpp"
#include "cairn/comm/communicator.hpp"
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

/// Splits a rank's description by owner: message `o` holds the leaves whose keys rank `o`
/// owns, with their indices among this rank's leaves (zstd-compressed). Common values are not
/// sent (see `scalable_plan`).
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
  for (std::size_t o = 0; o < part.size(); ++o) {
    if (part[o].tensors.empty() && part[o].objects.empty()) continue;
    detail::binary_writer w;
    w.blob(encode(part[o]));
    w.u64s(tensor_leaf[o]);
    w.u64s(object_leaf[o]);
    out[o] = detail::pack_message(w.data());
  }
  return out;
}

/// One slot a writer received from an owner, with the record of what it writes.
struct assigned_slot {
  write_slot slot;          ///< `leaf` is the writer's own leaf index; `chunk` is unused
  chunk_record chunk;       ///< tensors: region, tiles, nbytes (`where.file` = the writer)
  object_record object;     ///< objects
  dtype type = dtype::f32;  ///< tensors: the tensor's dtype and global shape
  shape global_shape;
};

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

/// Encodes one writer's slots (with their records) for the all_to_all back.
inline bytes encode_slots(const save_index& L,
                          const std::vector<write_slot>& slots,
                          const received_claims& c,
                          int writer) {
  binary_writer w;
  w.u64(slots.size());
  auto r = static_cast<std::size_t>(writer);
  for (const write_slot& s : slots) {
    w.u8(s.is_object);
    w.str(s.key);
    w.u64(s.is_object ? c.object_leaf[r].at(s.leaf) : c.tensor_leaf[r].at(s.leaf));
    w.u64(s.piece);
    w.i64(s.element);
    if (s.is_object) {
      const object_record& o = L.objects.at(s.key);
      w.str(o.key);
      w.ints(o.global_shape);
      w.ints(o.global_offset);
      w.u64(o.where.nbytes);
      continue;
    }
    const tensor_record& t = L.tensors.at(s.key);
    const chunk_record& ch = t.chunks.at(s.chunk);
    w.u8(static_cast<std::uint8_t>(t.type));
    w.ints(t.global_shape);
    w.ints(ch.region.offset);
    w.ints(ch.region.size);
    w.ints(ch.tiles);
    w.u64(ch.where.nbytes);
  }
  return pack_message(w.data());
}

inline std::vector<assigned_slot> decode_slots(std::span<const std::byte> msg, int writer) {
  std::vector<assigned_slot> out;
  if (msg.empty()) return out;
  bytes raw = unpack_message(msg);
  binary_reader rd(raw);
  out.resize(rd.u64());
  for (assigned_slot& a : out) {
    a.slot.is_object = rd.u8();
    a.slot.key = rd.str();
    a.slot.leaf = rd.u64();
    a.slot.piece = rd.u64();
    a.slot.element = rd.i64();
    if (a.slot.is_object) {
      a.object.key = rd.str();
      a.object.global_shape = rd.ints();
      a.object.global_offset = rd.ints();
      a.object.where = extent{static_cast<std::uint32_t>(writer), 0, rd.u64(), {}};
      continue;
    }
    a.type = static_cast<dtype>(rd.u8());
    a.global_shape = rd.ints();
    a.chunk.region.offset = rd.ints();
    a.chunk.region.size = rd.ints();
    a.chunk.tiles = rd.ints();
    a.chunk.where = extent{static_cast<std::uint32_t>(writer), 0, rd.u64(), {}};
  }
  return out;
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
                                     bool tile) {
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
      out.to_writer[r] = detail::encode_slots(out.index, out.index.slots[r], c, static_cast<int>(r));
  return out;
}

/// The writer's part: this rank's index from what every owner assigned it. It holds only the
/// chunks and objects this rank writes, in owner order, laid out one after the other; its
/// `slots` are empty except this rank's, and `bytes_of_rank` counts only this rank.
inline save_index writer_index(const std::vector<bytes>& from_owners,
                               int rank,
                               int world,
                               std::uint64_t block_size) {
  save_index L;
  L.world_size = world;
  L.block_size = block_size;
  L.slots.resize(static_cast<std::size_t>(world));
  L.bytes_of_rank.assign(static_cast<std::size_t>(world), 0);
  auto& mine = L.slots[static_cast<std::size_t>(rank)];
  std::uint64_t offset = 0;
  for (const bytes& msg : from_owners) {
    for (assigned_slot& a : detail::decode_slots(msg, rank)) {
      write_slot s = std::move(a.slot);
      extent& e = s.is_object ? a.object.where : a.chunk.where;
      e.byte_offset = offset;
      offset += e.nbytes;
      if (s.is_object) {
        L.objects[s.key] = std::move(a.object);
      } else {
        tensor_record& t = L.tensors[s.key];
        t.type = a.type;
        t.global_shape = std::move(a.global_shape);
        t.chunks.push_back(std::move(a.chunk));
        s.chunk = t.chunks.size() - 1;
      }
      mine.push_back(std::move(s));
    }
  }
  L.bytes_of_rank[static_cast<std::size_t>(rank)] = offset;
  return L;
}

namespace detail {

/// Rank 0's common values (path and hash), broadcast so that each rank compares its own.
inline bytes encode_commons(const std::vector<common_desc>& commons) {
  binary_writer w;
  w.u64(commons.size());
  for (const auto& c : commons) {
    w.str(c.path);
    w.u64(c.hash);
  }
  return std::move(w.data());
}

/// Compares this rank's common values with rank 0's (encode_commons), as check_commons does.
inline result<void> check_commons_against(const std::vector<common_desc>& mine,
                                          std::span<const std::byte> root_commons,
                                          int rank) {
  binary_reader rd(root_commons);
  std::map<std::string, std::uint64_t> ref;
  for (std::uint64_t n = rd.u64(); n > 0; --n) {
    std::string path = rd.str();
    ref[path] = rd.u64();
  }
  return compare_commons(ref, mine, rank);
}

}  // namespace detail

/// What scalable planning agreed on, as this rank sees it.
struct scalable_agreement {
  save_index index;             ///< this rank's index (`writer_index`)
  std::string save_id;          ///< rank 0's save id
  bool exists_at_root = false;  ///< rank 0 found a committed checkpoint
};

/// Collective: plans a save with every rank's description `me` (or its local failure), the
/// scalable way (see the top of this header). Fails on every rank alike, with the lowest
/// failing rank's error.
inline result<scalable_agreement> scalable_plan(const rank_desc& me,
                                                const std::optional<error>& failure,
                                                comm_ref comm,
                                                bool validate,
                                                std::uint64_t block_size,
                                                std::uint64_t split_min_bytes,
                                                bool tile) {
  const int world = comm.size(), rank = comm.rank();
  // 1. Statuses meet at rank 0, which sends back its save id, whether a checkpoint exists and
  //    its common values.
  auto [started, root_said] = agree_at_root(comm, 0, failure, {}, [&](const auto&) {
    detail::binary_writer w;
    w.u8(me.checkpoint_exists);
    w.str(me.save_id);
    w.blob(detail::encode_commons(me.commons));
    return std::pair{std::optional<error>{}, std::move(w.data())};
  });
  if (started) return std::move(*started);
  scalable_agreement out;
  detail::binary_reader rd(root_said);
  out.exists_at_root = rd.u8();
  out.save_id = rd.str();
  bytes root_commons = rd.blob();
  // 2. Claims go to their owners; each owner checks and plans its keys.
  std::optional<error> mine;
  if (validate) {
    if (auto c = detail::check_commons_against(me.commons, root_commons, rank); !c)
      mine = std::move(c).err();
  }
  std::vector<bytes> received = comm.all_to_all(claims_by_owner(me, world));
  std::vector<bytes> to_writer(static_cast<std::size_t>(world));
  auto owned = detail::catch_all("planning owned keys", [&] {
    return plan_owned(received, validate, block_size, split_min_bytes, tile);
  });
  received.clear();
  if (owned)
    to_writer = std::move(owned->to_writer);
  else if (!mine)
    mine = std::move(owned).err();
  // 3. Each writer receives its slots; statuses meet at rank 0 again.
  std::vector<bytes> assigned = comm.all_to_all(to_writer);
  auto [verdict, unused] = agree_at_root(comm, 0, mine, {}, [](const auto&) {
    return std::pair{std::optional<error>{}, bytes{}};
  });
  if (verdict) return std::move(*verdict);
  out.index = writer_index(assigned, rank, world, block_size);
  return out;
}

}  // namespace cairn
