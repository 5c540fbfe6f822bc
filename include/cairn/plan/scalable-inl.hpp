// cairn/plan/scalable-inl.hpp: the bodies of cairn/plan/scalable.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <zstd.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "cairn/plan/scalable.hpp"

namespace cairn::detail {

CAIRN_INLINE bytes pack_message(std::span<const std::byte> b) {
  bytes out(ZSTD_compressBound(b.size()));
  std::size_t n = ZSTD_compress(out.data(), out.size(), b.data(), b.size(), 1);
  if (ZSTD_isError(n)) throw std::runtime_error("zstd: " + std::string(ZSTD_getErrorName(n)));
  out.resize(n);
  return out;
}

CAIRN_INLINE bytes unpack_message(std::span<const std::byte> b, std::uint64_t limit) {
  if (b.empty()) return {};
  unsigned long long size = ZSTD_getFrameContentSize(b.data(), b.size());
  if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR || size > limit)
    throw std::length_error("planning message: bad zstd frame");
  bytes out(size);
  std::size_t n = ZSTD_decompress(out.data(), out.size(), b.data(), b.size());
  if (ZSTD_isError(n) || n != size) throw std::length_error("planning message: bad zstd frame");
  return out;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE bytes encode_claims(const rank_desc& part,
                                 const std::vector<std::uint64_t>& tensor_leaf,
                                 const std::vector<std::uint64_t>& object_leaf) {
  return detail::pack_message(
      detail::encode_message(detail::claims_message{part, tensor_leaf, object_leaf}));
}

CAIRN_INLINE std::vector<bytes> claims_by_owner(const rank_desc& me, int world) {
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

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE received_claims decode_claims(const std::vector<bytes>& received) {
  received_claims c;
  c.ranks.resize(received.size());
  c.tensor_leaf.resize(received.size());
  c.object_leaf.resize(received.size());
  for (std::size_t r = 0; r < received.size(); ++r) {
    if (received[r].empty()) continue;
    result<claims_message> m = decode_message<claims_message>(unpack_message(received[r]));
    if (!m) throw exception(std::move(m).err().with_rank(static_cast<int>(r)));
    c.ranks[r] = std::move(m->part);
    c.tensor_leaf[r] = std::move(m->tensor_leaf);
    c.object_leaf[r] = std::move(m->object_leaf);
    if (c.tensor_leaf[r].size() != c.ranks[r].tensors.size() ||
        c.object_leaf[r].size() != c.ranks[r].objects.size())
      throw std::length_error("planning message: leaf lists disagree");
  }
  return c;
}

CAIRN_INLINE bytes encode_slots(const save_index& L,
                                const std::vector<write_slot>& slots,
                                const received_claims& c,
                                int writer) {
  slots_message m;
  m.slots.reserve(slots.size());
  auto r = static_cast<std::size_t>(writer);
  for (const write_slot& s : slots) {
    if (s.is_object) {
      m.slots.emplace_back(object_slot_message{c.object_leaf[r].at(s.leaf)});
      continue;
    }
    const chunk_record& ch = L.tensors.at(s.key).chunks.at(s.chunk);
    // The writer rebuilds the region from the range: check here that it will get this one.
    const box& held = c.ranks[r].tensors.at(s.leaf).pieces.at(s.piece);
    auto again = flat_range_boxes(held, s.element, s.element + ch.region.volume());
    if (again.size() != 1 || again[0].region.offset != ch.region.offset ||
        again[0].region.size != ch.region.size)
      throw std::logic_error("scalable planning: a chunk of " + s.key +
                             " is not the box of its element range");
    m.slots.emplace_back(
        tensor_slot_message{c.tensor_leaf[r].at(s.leaf), s.piece, s.element, ch.region.volume()});
  }
  return pack_message(encode_message(m));
}

CAIRN_INLINE void check_slot(bool ok) {
  if (!ok) throw std::length_error("planning message: a slot names no leaf of this rank");
}

CAIRN_INLINE void add_slot(const slot_message& slot,
                           const rank_desc& me,
                           int rank,
                           tiling tile,
                           std::uint64_t& offset,
                           save_index& L) {
  write_slot s;
  s.is_object = std::holds_alternative<object_slot_message>(slot);
  auto file = static_cast<std::uint32_t>(rank);
  if (const auto* object = std::get_if<object_slot_message>(&slot)) {
    s.leaf = object->leaf;
    check_slot(s.leaf < me.objects.size());
    const object_desc& o = me.objects[s.leaf];
    s.key = object_unique_key(o.key, o.global_offset, o.global_shape);
    L.objects[s.key] =
        object_record{o.key, o.global_shape, o.global_offset, extent{file, offset, o.nbytes, {}}};
    offset += o.nbytes;
  } else {
    const auto& chunk = std::get<tensor_slot_message>(slot);
    s.leaf = chunk.leaf;
    check_slot(s.leaf < me.tensors.size());
    const tensor_desc& t = me.tensors[s.leaf];
    s.key = t.key;
    s.piece = chunk.piece;
    s.element = chunk.element;
    const std::int64_t count = chunk.count;
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

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<owner_plan> plan_owned(const std::vector<bytes>& received,
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

CAIRN_INLINE save_index writer_index(const std::vector<bytes>& from_owners,
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
    result<detail::slots_message> m =
        detail::decode_message<detail::slots_message>(detail::unpack_message(msg));
    if (!m) throw exception(std::move(m).err().with_rank(rank));
    for (const auto& slot : m->slots) detail::add_slot(slot, me, rank, tile, offset, L);
  }
  L.bytes_of_rank[static_cast<std::size_t>(rank)] = offset;
  return L;
}

}  // namespace cairn
