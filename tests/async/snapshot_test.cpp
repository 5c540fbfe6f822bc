// staged_snapshot: checksums taken over staged spans, checked again; a changed byte is named by
// key and range.
#include "cairn/async/snapshot.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

namespace {

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

}  // namespace

TEST_CASE("staged snapshot: unchanged spans verify, a changed byte names its key and range") {
  std::vector<std::byte> a = pattern(10'000, 1), b = pattern(3'000, 2), empty;
  const cairn::detail::staged_span spans[] = {
      {a.data(), a.size(), "layer.w"}, {empty.data(), 0, "none"}, {b.data(), b.size(), "b"}};
  cairn::detail::staged_snapshot snap;
  snap.seal(spans, 2, 4096);  // pieces of 4 KiB: a has 3, b has 1
  CHECK(snap.sealed_bytes() == 13'000);
  CHECK(snap.verify(2));

  a[9'000] ^= std::byte{1};  // in a's third piece: bytes 8192..10000
  auto r = snap.verify(2);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().key == "layer.w");
  CHECK(r.err().message.find("bytes 8192..10000") != std::string::npos);

  a[9'000] ^= std::byte{1};
  CHECK(snap.verify(1));
  b[0] ^= std::byte{0x80};
  r = snap.verify(1);
  REQUIRE(!r);
  CHECK(r.err().key == "b");
  CHECK(r.err().message.find("bytes 0..3000") != std::string::npos);

  snap.seal(spans, 1, 4096);  // a new seal takes the bytes as they are now
  CHECK(snap.verify(1));
}
