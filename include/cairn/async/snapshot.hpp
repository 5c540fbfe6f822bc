// cairn/async/snapshot.hpp: checksums of what an async save staged, taken before its
// background write starts and checked again after the write ended, so that bytes changed in
// the staging pool in between (a stray write, a reused buffer) fail the save instead of being
// persisted with valid checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn::detail {

/// One span of staged bytes and the key it belongs to (for errors).
struct staged_span {
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::string_view key = {};
};

/// XXH3-64 checksums of staged spans in pieces of `piece_bytes`. `seal` takes them; `verify`
/// takes them again and reports the first piece whose bytes changed, naming its key, the
/// offset within the key's staged bytes and the two checksums. A span's memory must stay
/// allocated from `seal` until `verify` returns; its key must outlive the snapshot.
class staged_snapshot {
 public:
  /// Bytes per checksum: small enough to name where a change was, large enough that hashing
  /// runs at memory speed.
  static constexpr std::size_t default_piece_bytes = std::size_t{1} << 20;

  /// Checksums every span on up to `threads` threads; replaces what an earlier seal took.
  void seal(std::span<const staged_span> spans,
            int threads,
            std::size_t piece_bytes = default_piece_bytes);

  /// Checksums the sealed spans again on up to `threads` threads: errc::corrupt naming the key
  /// and offset of the first piece that changed since `seal`.
  result<void> verify(int threads) const;

  /// Bytes covered by the last seal.
  std::uint64_t sealed_bytes() const noexcept { return sealed_bytes_; }

 private:
  struct piece {
    std::size_t span;
    std::size_t offset;
    std::size_t bytes;
    std::uint64_t sum;
  };
  std::vector<staged_span> spans_;
  std::vector<piece> pieces_;
  std::uint64_t sealed_bytes_ = 0;
};

}  // namespace cairn::detail

#if CAIRN_HEADER_ONLY
#  include "cairn/async/snapshot-inl.hpp"
#endif
