// cairn/plan/owner.hpp: which rank owns a checkpoint key. Scalable save planning sends each
// key's leaves to its owner, format version 4 routes each key's chunk records to its owner's
// index file, and a load asks each key's owner which rank reads the pieces every rank wants:
// one hash, so that every step agrees.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "cairn/core/checksum.hpp"

namespace cairn {

/// A hash of a checkpoint key (XXH3-64 of its bytes): which rank owns it, and where ties start
/// when planning rotates.
inline std::uint64_t key_hash(std::string_view key) {
  return checksum(std::as_bytes(std::span(key.data(), key.size())));
}

/// The rank that owns key `key` among `world` ranks.
inline int owner_of(std::string_view key, int world) {
  return world <= 1 ? 0 : static_cast<int>(key_hash(key) % static_cast<std::uint64_t>(world));
}

}  // namespace cairn
