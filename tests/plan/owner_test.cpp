// Key owners (plan/owner.hpp): every step that routes by key agrees on one owner per key, in
// range, spread over the ranks.
#include "cairn/plan/owner.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_CASE("owner_of is in range, the same every time, and spreads keys over the ranks") {
  CHECK(cairn::owner_of("model.w", 0) == 0);
  CHECK(cairn::owner_of("model.w", 1) == 0);
  std::vector<int> owned(64, 0);
  for (int i = 0; i < 6400; ++i) {
    const std::string key = "layers." + std::to_string(i) + ".weight";
    const int o = cairn::owner_of(key, 64);
    REQUIRE(o >= 0);
    REQUIRE(o < 64);
    CHECK(o == cairn::owner_of(key, 64));
    ++owned[static_cast<std::size_t>(o)];
  }
  for (int n : owned) CHECK((n > 50 && n < 150));  // about 100 each
  CHECK(cairn::key_hash("a") != cairn::key_hash("b"));
}
