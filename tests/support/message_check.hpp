// tests/support/message_check.hpp: the two checks every message type between ranks gets: a
// round trip (decode(encode(x)) re-encodes to the same bytes, so no field is dropped) and
// truncation (every strict prefix of the encoding, and the encoding with a byte added, is an
// errc::comm error, never a crash, a throw or a value).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <span>

#include "cairn/core/error.hpp"
#include "cairn/detail/message.hpp"

namespace cairn_test {

/// Checks `sample`'s round trip and that truncated or padded encodings are refused. Give a
/// sample whose fields are not their defaults, and non-empty containers.
template <class T>
void check_message(const T& sample) {
  const cairn::bytes b = cairn::detail::encode_message(sample);
  cairn::result<T> back = cairn::detail::decode_message<T>(b);
  REQUIRE(back.has_value());
  CHECK(cairn::detail::encode_message(*back) == b);
  for (std::size_t n = 0; n < b.size(); ++n) {
    cairn::result<T> cut = cairn::detail::decode_message<T>(std::span(b).first(n));
    REQUIRE_MESSAGE(!cut.has_value(), "a prefix of ", n, " of ", b.size(), " bytes decoded");
    CHECK(cut.err().code == cairn::errc::comm);
  }
  cairn::bytes padded = b;
  padded.push_back(std::byte{0});
  cairn::result<T> extra = cairn::detail::decode_message<T>(padded);
  REQUIRE_FALSE(extra.has_value());
  CHECK(extra.err().message.find("left over") != std::string::npos);
}

}  // namespace cairn_test
