// storage_decorator (storage/decorator.hpp): every member forwarded to the wrapped backend with
// its results and errors, a derived decorator's redefinitions taking effect through storage_ref,
// features and remove_temporaries forwarded, decorators stacking.
#include "cairn/storage/decorator.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/storage/conformance.hpp"

namespace decorator_test {

// Redefines put (refuses a read-only folder, counts bytes) and features; the rest is inherited.
template <class S>
class guarded : public cairn::storage_decorator<S> {
 public:
  using cairn::storage_decorator<S>::storage_decorator;
  std::uint64_t bytes_put = 0;

  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    if (name.starts_with("ro/"))
      return cairn::make_error(cairn::errc::invalid_argument, "read-only: " + std::string(name));
    bytes_put += data.size();
    return this->inner_->put(name, data);
  }
  cairn::storage_features features() const {
    cairn::storage_features f = cairn::storage_decorator<S>::features();
    f.durable = true;  // pretend a replica makes it so
    return f;
  }
};

}  // namespace decorator_test

static_assert(cairn::storage<cairn::storage_decorator<cairn::memory_storage>>);
static_assert(cairn::storage_with_temporaries<cairn::storage_decorator<cairn::memory_storage>>);
static_assert(cairn::storage<decorator_test::guarded<cairn::storage_ref>>);

TEST_SUITE("storage_decorator") {
  TEST_CASE("the plain decorator forwards every member, errors included") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    cairn::storage_decorator<cairn::memory_storage> dec{mem};
    CHECK(&dec.inner() == &mem);
    CHECK(dec.features() == cairn::memory_storage::features);
    CHECK(cairn::storage_ref(dec).features() == cairn::memory_storage::features);

    require_ok(dec.put("a/x", pattern(10)));
    CHECK(mem.contents("a/x") == pattern(10));
    auto w = dec.open_writer("a/w");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(2, pattern(3)));
    CHECK(!mem.exists("a/w").value());  // memory publishes on finish, through the decorator too
    require_ok((*w)->finish());
    CHECK(dec.size("a/w").value() == 5);
    CHECK(dec.exists("a/x").value());
    CHECK(list_of(dec, "a/") == std::vector<std::string>{"a/w", "a/x"});
    bytes out(4);
    require_ok(dec.read("a/x", 6, out));
    const bytes all = pattern(10);
    CHECK(out == bytes(all.begin() + 6, all.end()));
    CHECK(dec.describe("a/x") == "mem://a/x");
    require_ok(dec.remove("a/x"));
    CHECK(!mem.exists("a/x").value());

    auto missing = dec.read("a/x", 0, out);
    REQUIRE(!missing);
    CHECK(missing.err().code == errc::not_found);
    CHECK(missing.err().file == "mem://a/x");
    auto bad = dec.put("../x", pattern(1));
    REQUIRE(!bad);
    CHECK(bad.err().code == errc::invalid_argument);
    CHECK(dec.remove_temporaries("").value() == 0);  // memory has no temporaries
  }

  TEST_CASE("a derived decorator's redefinitions are what storage_ref calls") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    decorator_test::guarded<cairn::memory_storage> g{mem};
    cairn::storage_ref s = g;
    require_ok(s.put("rw/a", pattern(7)));
    auto refused = s.put("ro/a", pattern(7));
    REQUIRE(!refused);
    CHECK(refused.err().code == errc::invalid_argument);
    CHECK(refused.err().message.find("ro/a") != std::string::npos);
    CHECK(!mem.exists("ro/a").value());
    CHECK(g.bytes_put == 7);
    // Writers are inherited: they are not guarded.
    auto w = s.open_writer("ro/b");
    REQUIRE(w.has_value());
    require_ok((*w)->finish());
    CHECK(mem.exists("ro/b").value());

    cairn::storage_features expect = cairn::memory_storage::features;
    expect.durable = true;
    CHECK(s.features() == expect);
    // A plain decorator around it reports the derived features, not the backend's.
    cairn::storage_decorator<decorator_test::guarded<cairn::memory_storage>> outer{g};
    CHECK(outer.features() == expect);
    require_ok(outer.put("rw/c", pattern(1)));
    CHECK(g.bytes_put == 8);
    CHECK(outer.put("ro/c", pattern(1)).err().code == errc::invalid_argument);
  }

  TEST_CASE("remove_temporaries reaches a file backend, also through a storage_ref") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("s/kept.bin", pattern(4)));
    std::ofstream(d.path / "s" / ".a.tmp.77.00000000000000ff") << "x";
    std::ofstream(d.path / "s" / ".b.tmp.77.00000000000000ff") << "x";
    std::ofstream(d.path / ".c.tmp.77.00000000000000ff") << "x";

    cairn::storage_decorator<cairn::file_storage> dec{disk};
    CHECK(dec.features() == cairn::file_storage::features);
    CHECK(dec.remove_temporaries("s/a").value() == 1);
    cairn::storage_ref r = disk;
    cairn::storage_decorator<cairn::storage_ref> over_ref{r};
    CHECK(over_ref.remove_temporaries("").value() == 2);
    CHECK(over_ref.remove_temporaries("").value() == 0);
    CHECK(list_of(over_ref, "") == std::vector<std::string>{"s/kept.bin"});
    CHECK(over_ref.describe("s/kept.bin") == (d.path / "s/kept.bin").string());
  }
}
