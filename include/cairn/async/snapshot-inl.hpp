// cairn/async/snapshot-inl.hpp: the bodies of cairn/async/snapshot.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <string>

#include "cairn/async/snapshot.hpp"
#include "cairn/core/checksum.hpp"
#include "cairn/detail/parallel.hpp"

namespace cairn::detail {

CAIRN_INLINE void staged_snapshot::seal(std::span<const staged_span> spans,
                                        int threads,
                                        std::size_t piece_bytes) {
  piece_bytes = std::max<std::size_t>(piece_bytes, 1);
  spans_.assign(spans.begin(), spans.end());
  pieces_.clear();
  sealed_bytes_ = 0;
  for (std::size_t s = 0; s < spans_.size(); ++s) {
    sealed_bytes_ += spans_[s].bytes;
    for (std::size_t off = 0; off < spans_[s].bytes; off += piece_bytes)
      pieces_.push_back({s, off, std::min(piece_bytes, spans_[s].bytes - off), 0});
  }
  (void)run_parallel(pieces_.size(), threads, [&](std::size_t i) -> result<void> {
    piece& p = pieces_[i];
    p.sum = checksum({spans_[p.span].data + p.offset, p.bytes});
    return ok();
  });
}

CAIRN_INLINE result<void> staged_snapshot::verify(int threads) const {
  return run_parallel(pieces_.size(), threads, [&](std::size_t i) -> result<void> {
    const piece& p = pieces_[i];
    const staged_span& s = spans_[p.span];
    const std::uint64_t now = checksum({s.data + p.offset, p.bytes});
    if (now == p.sum) return ok();
    return make_error(errc::corrupt,
                      "the staged bytes of '" + std::string(s.key) +
                          "' changed between staging "
                          "and the end of the write (bytes " +
                          std::to_string(p.offset) + ".." + std::to_string(p.offset + p.bytes) +
                          " of the key's staged copy: "
                          "checksum " +
                          checksum_hex(p.sum) + " when staged, " + checksum_hex(now) +
                          " after the write); nothing of this save is "
                          "committed")
        .with_key(std::string(s.key));
  });
}

}  // namespace cairn::detail
