// any_storage (storage/any_storage.hpp): ownership of a moved-in, copied-in, shared or unique
// backend, copies sharing it, the backend living as long as its last owner, ref(), and every call
// (features and remove_temporaries included) forwarded with its results and errors.
#include "cairn/storage/any_storage.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/prefixed.hpp"
#include "tests/storage/conformance.hpp"

static_assert(!std::is_constructible_v<cairn::any_storage, cairn::storage_ref&>);
static_assert(!std::is_convertible_v<cairn::memory_storage, cairn::any_storage>);
static_assert(std::is_copy_constructible_v<cairn::any_storage>);

TEST_SUITE("any_storage") {
  TEST_CASE("owns a moved-in backend and copies share it") {
    using namespace cairn_storage_test;
    cairn::any_storage a{cairn::memory_storage{}};
    CHECK(a.features() == cairn::memory_storage::features);
    require_ok(a.put("x/one", pattern(8, 1)));
    cairn::any_storage b = a;
    CHECK(read_all(b, "x/one") == pattern(8, 1));
    auto w = b.open_writer("x/two");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(5, 2)));
    CHECK(!a.exists("x/two").value());
    require_ok((*w)->finish());
    CHECK(a.size("x/two").value() == 5);
    CHECK(list_of(a, "x/") == std::vector<std::string>{"x/one", "x/two"});
    require_ok(b.remove("x/one"));
    CHECK(!a.exists("x/one").value());
    CHECK(a.describe("x/one") == "mem://x/one");

    bytes out(3);
    auto missing = a.read("x/one", 0, out);
    REQUIRE(!missing);
    CHECK(missing.err().code == errc::not_found);
    CHECK(missing.err().file == "mem://x/one");
    auto past = a.read("x/two", 4, out);
    REQUIRE(!past);
    CHECK(past.err().code == errc::corrupt);
    CHECK(*past.err().offset == 5);
    CHECK(a.remove_temporaries("").value() == 0);
  }

  TEST_CASE("a shared backend lives as long as its last owner, and ref() reaches it") {
    using namespace cairn_storage_test;
    auto backend = std::make_shared<cairn::memory_storage>();
    std::weak_ptr<cairn::memory_storage> watch = backend;
    std::optional<cairn::any_storage> first{std::in_place, backend};
    backend.reset();
    require_ok(first->put("k", pattern(4)));
    cairn::storage_ref direct = first->ref();
    CHECK(direct.describe("k") == "mem://k");
    CHECK(direct.features() == cairn::memory_storage::features);
    {
      cairn::any_storage second = *first;
      first.reset();
      CHECK(!watch.expired());
      CHECK(read_all(direct, "k") == pattern(4));  // ref() does not go through `first`
      CHECK(watch.lock()->object_count() == 1);
      CHECK(second.exists("k").value());
    }
    CHECK(watch.expired());

    std::unique_ptr<cairn::memory_storage> unique = std::make_unique<cairn::memory_storage>();
    cairn::memory_storage* raw = unique.get();
    cairn::any_storage owner{std::move(unique)};
    require_ok(owner.put("u", pattern(2)));
    CHECK(raw->contents("u") == pattern(2));
    CHECK(owner.ref().describe("u") == "mem://u");
  }

  TEST_CASE("a copyable backend is copied in") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    std::optional<cairn::prefixed_storage> sub{cairn::prefixed_storage::make(mem, "p/").value()};
    cairn::any_storage owned{*sub};
    sub.reset();  // the copy inside `owned` stays
    require_ok(owned.put("n", pattern(3)));
    CHECK(mem.contents("p/n") == pattern(3));
    CHECK(owned.describe("n") == "mem://p/n");
    CHECK(list_of(owned, "") == std::vector<std::string>{"n"});
  }

  TEST_CASE("features and remove_temporaries of an owned file backend") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::any_storage disk{cairn::file_storage{d.path}};
    CHECK(disk.features() == cairn::file_storage::features);
    CHECK(cairn::storage_ref(disk).features() == cairn::file_storage::features);
    require_ok(disk.put("a/m.json", text("{}")));
    std::ofstream(d.path / "a" / ".m.json.tmp.42.0123456789abcdef") << "partial";
    std::ofstream(d.path / ".z.tmp.42.0123456789abcdef") << "partial";
    CHECK(disk.remove_temporaries("a/").value() == 1);
    CHECK(disk.ref().remove_temporaries("").value() == 1);
    CHECK(disk.remove_temporaries("").value() == 0);
    CHECK(disk.describe("a/m.json") == (d.path / "a/m.json").string());
    auto bad = disk.remove_temporaries("/abs");
    REQUIRE(!bad);
    CHECK(bad.err().code == errc::invalid_argument);
  }
}
