// The storage conformance suite's shared helpers: temporary directories, deterministic bytes and
// checked reads. Included by tests/storage/conformance_test.cpp and by the s3 tests, which run the
// same cases (tests/storage/conformance_cases.hpp) over their own backends.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cairn/storage/storage.hpp"

namespace cairn_storage_test {

namespace fs = std::filesystem;
using cairn::errc;
using bytes = std::vector<std::byte>;

// A fresh directory under /tmp, removed with everything in it when the object dies.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "cairn-storage-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

// Deterministic, seed-dependent contents.
inline bytes pattern(std::size_t n, std::uint32_t seed = 1) {
  bytes b(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<std::byte>(x);
  }
  return b;
}

inline bytes text(std::string_view s) {
  bytes b(s.size());
  std::transform(s.begin(), s.end(), b.begin(), [](char c) { return static_cast<std::byte>(c); });
  return b;
}

inline bytes read_all(cairn::storage_ref s, std::string_view name) {
  auto n = s.size(name);
  REQUIRE_MESSAGE(n.has_value(), n.err().describe());
  bytes out(*n);
  auto r = s.read(name, 0, out);
  REQUIRE_MESSAGE(r.has_value(), r.err().describe());
  return out;
}

inline void require_ok(const cairn::result<void>& r) {
  REQUIRE_MESSAGE(r.has_value(), r.err().describe());
}

inline std::vector<std::string> list_of(cairn::storage_ref s, std::string_view prefix) {
  auto l = s.list(prefix);
  REQUIRE_MESSAGE(l.has_value(), l.err().describe());
  return *l;
}

/// True, after printing "SKIP: ..." (ctest reports a skip), when the backend does not promise
/// that reads and lists see completed writes at once: every conformance case relies on it.
inline bool skipped_without_consistency(cairn::storage_ref s) {
  const cairn::storage_features f = s.features();
  if (f.read_after_write && f.list_after_write) return false;
  std::printf("SKIP: the backend does not declare read_after_write and list_after_write\n");
  return true;
}

/// Whether fixture F's test server is weaker than the backend it stands in for: it rewrites an
/// object in place on replacement (s3rver does; S3, whose s3_storage declares atomic_put, does
/// not), so concurrent readers may see a mix: the case that checks it is skipped.
template <class F>
constexpr bool replaces_in_place() {
  if constexpr (requires { F::replaces_in_place; })
    return F::replaces_in_place;
  else
    return false;
}

}  // namespace cairn_storage_test
