// open_storage(uri) and any_storage: which backend each URI opens, the named memory storages of
// memory://, errors for unknown schemes, schemes a program registers, and what any_storage
// forwards. (s3:// is tested in tests/s3, where the S3 part is built.)
#include "cairn/storage/open.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/storage/conformance.hpp"

using namespace cairn_storage_test;

TEST_SUITE("open_storage") {
  TEST_CASE("a plain path and file:// open a file_storage there") {
    temp_dir d;
    const std::string root = (d.path / "ckpt").string();
    auto plain = cairn::open_storage(root);
    REQUIRE_MESSAGE(plain.has_value(), plain.err().describe());
    CHECK(plain->describe("a.bin") == (d.path / "ckpt" / "a.bin").string());
    CHECK(plain->features() == cairn::file_storage::features);
    require_ok(plain->put("a.bin", pattern(10)));
    CHECK(fs::file_size(d.path / "ckpt" / "a.bin") == 10);

    auto uri = cairn::open_storage("file://" + root);
    REQUIRE(uri.has_value());
    CHECK(read_all(*uri, "a.bin") == pattern(10));
    auto upper = cairn::open_storage("FILE://" + root);
    REQUIRE(upper.has_value());
    CHECK(upper->exists("a.bin").value());

    auto relative = cairn::open_storage("some/dir");
    REQUIRE(relative.has_value());
    CHECK(relative->describe("x") == "some/dir/x");
  }

  TEST_CASE("memory://name is one storage per name for the whole process") {
    auto a = cairn::open_storage("memory://open-test-a");
    auto a2 = cairn::open_storage("memory://open-test-a");
    auto b = cairn::open_storage("memory://open-test-b");
    REQUIRE(a.has_value());
    REQUIRE(a2.has_value());
    REQUIRE(b.has_value());
    require_ok(a->put("k", pattern(4)));
    CHECK(read_all(*a2, "k") == pattern(4));
    CHECK(!b->exists("k").value());
    CHECK(cairn::named_memory_storage("open-test-a")->object_count() == 1);
    CHECK(a->features() == cairn::memory_storage::features);
  }

  TEST_CASE("an unknown scheme or an empty URI is invalid_argument naming it") {
    for (std::string_view uri : {"gs://bucket/p", "hdfs://x", "9p://y", "/a/b://c"}) {
      CAPTURE(uri);
      auto r = cairn::open_storage(uri);
      REQUIRE(!r);
      CHECK(r.err().code == errc::invalid_argument);
      CHECK(r.err().message.find(std::string(uri)) != std::string::npos);
      CHECK(r.err().message.find("file://") != std::string::npos);  // the known schemes
    }
    auto empty = cairn::open_storage("");
    REQUIRE(!empty);
    CHECK(empty.err().code == errc::invalid_argument);
    auto no_path = cairn::open_storage("file://");
    REQUIRE(!no_path);
    CHECK(no_path.err().code == errc::invalid_argument);
  }

  TEST_CASE("s3:// without the S3 part says what it needs") {
    // This test program does not include cairn/storage/s3.hpp.
    auto r = cairn::open_storage("s3://bucket/prefix");
    REQUIRE(!r);
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("s3://bucket/prefix") != std::string::npos);
    CHECK(r.err().message.find("cairn::s3") != std::string::npos);
    const auto schemes = cairn::storage_schemes();
    CHECK(std::find(schemes.begin(), schemes.end(), "s3") == schemes.end());
  }

  TEST_CASE("a program registers its own schemes") {
    std::vector<std::string> seen;
    cairn::register_storage_scheme("Test-KV",
                                   [&](std::string_view uri) -> cairn::result<cairn::any_storage> {
                                     seen.emplace_back(uri);
                                     return cairn::any_storage(cairn::memory_storage{});
                                   });
    auto r = cairn::open_storage("test-kv://anything/at/all");
    REQUIRE(r.has_value());
    CHECK(seen == std::vector<std::string>{"test-kv://anything/at/all"});
    require_ok(r->put("x", pattern(1)));
    const auto schemes = cairn::storage_schemes();
    CHECK(std::find(schemes.begin(), schemes.end(), "test-kv") != schemes.end());
    CHECK(std::find(schemes.begin(), schemes.end(), "memory") != schemes.end());

    cairn::register_storage_scheme(
        "test-refuses", [](std::string_view uri) -> cairn::result<cairn::any_storage> {
          return cairn::make_error(errc::invalid_argument, "refused " + std::string(uri));
        });
    auto refused = cairn::open_storage("test-refuses://x");
    REQUIRE(!refused);
    CHECK(refused.err().message == "refused test-refuses://x");
  }
}

TEST_SUITE("any_storage") {
  TEST_CASE("owns its backend, copies share it, ref() skips the handle") {
    cairn::any_storage a{cairn::memory_storage{}};
    cairn::any_storage copy = a;
    require_ok(a.put("k", pattern(3)));
    CHECK(read_all(copy, "k") == pattern(3));
    cairn::storage_ref direct = a.ref();
    CHECK(read_all(direct, "k") == pattern(3));
    CHECK(cairn::storage_ref(a).features() == cairn::memory_storage::features);

    auto owned = std::make_shared<cairn::memory_storage>();
    cairn::any_storage shared{owned};
    require_ok(shared.put("s", pattern(2)));
    CHECK(owned->exists("s").value());
    cairn::any_storage unique{std::make_unique<cairn::memory_storage>()};
    CHECK(unique.list("").value().empty());
  }

  TEST_CASE("forwards remove_temporaries") {
    temp_dir d;
    cairn::any_storage disk{cairn::file_storage{d.path}};
    require_ok(disk.put("sub/m.json", pattern(4)));
    std::ofstream(d.path / "sub" / ".m.json.tmp.1234.0123456789abcdef") << "partial";
    CHECK(cairn::storage_ref(disk).remove_temporaries("").value() == 1);
  }
}
