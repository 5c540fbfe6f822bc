// prefixed_storage (storage/prefixed.hpp): make's prefix rules, every call mapped to
// `prefix + name` on the backend, list without the prefix and bounded by it, names that would
// leave the prefix rejected, features and remove_temporaries reaching the backend.
#include "cairn/storage/prefixed.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/storage/conformance.hpp"

static_assert(cairn::storage<cairn::prefixed_storage>);
static_assert(cairn::storage_with_temporaries<cairn::prefixed_storage>);

TEST_SUITE("prefixed_storage") {
  TEST_CASE("make takes an empty prefix or a valid name ending in a slash") {
    cairn::memory_storage mem;
    for (const char* p : {"", "run1/", "run1/step10/", ".a/b../"}) {
      CAPTURE(p);
      auto s = cairn::prefixed_storage::make(mem, p);
      REQUIRE(s.has_value());
      CHECK(s->prefix() == p);
    }
    for (const char* p : {"run1", "/", "/abs/", "a//", "../x/", "a/../b/", "./", "a/./", "a/b"}) {
      CAPTURE(p);
      auto s = cairn::prefixed_storage::make(mem, p);
      REQUIRE(!s);
      CHECK(s.err().code == cairn::errc::invalid_argument);
      const std::string named = s.err().message;
      // The message names the prefix, or the part of it that is not a valid name.
      std::string core = p;
      if (!core.empty() && core.back() == '/') core.pop_back();
      CHECK(named.find("\"" + core) != std::string::npos);
    }
  }

  TEST_CASE("every call reaches prefix plus name and list strips the prefix") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    require_ok(mem.put("run1/step10x", pattern(1)));  // shares the prefix's text, not its folder
    require_ok(mem.put("run1/step1/a", pattern(2)));
    require_ok(mem.put("other", pattern(3)));
    auto made = cairn::prefixed_storage::make(mem, "run1/step10/");
    REQUIRE(made.has_value());
    cairn::prefixed_storage sub = std::move(made).value();
    CHECK(list_of(sub, "").empty());

    require_ok(sub.put("metadata.json", text("{}")));
    auto w = sub.open_writer("shards/__0_0.distcp");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(64, 7)));
    require_ok((*w)->finish());
    CHECK(read_all(mem, "run1/step10/metadata.json") == text("{}"));
    CHECK(read_all(mem, "run1/step10/shards/__0_0.distcp") == pattern(64, 7));
    CHECK(read_all(sub, "shards/__0_0.distcp") == pattern(64, 7));
    CHECK(sub.size("metadata.json").value() == 2);
    CHECK(sub.exists("metadata.json").value());
    CHECK(!sub.exists("a").value());  // run1/step1/a is outside

    CHECK(list_of(sub, "") == std::vector<std::string>{"metadata.json", "shards/__0_0.distcp"});
    CHECK(list_of(sub, "sh") == std::vector<std::string>{"shards/__0_0.distcp"});
    CHECK(list_of(sub, "shards/x").empty());

    CHECK(sub.describe("metadata.json") == "mem://run1/step10/metadata.json");
    bytes out(4);
    auto missing = sub.read("gone.bin", 0, out);
    REQUIRE(!missing);
    CHECK(missing.err().code == errc::not_found);
    CHECK(missing.err().file == "mem://run1/step10/gone.bin");
    auto past = sub.read("metadata.json", 1, out);
    REQUIRE(!past);
    CHECK(past.err().code == errc::corrupt);
    CHECK(past.err().file == "mem://run1/step10/metadata.json");
    CHECK(*past.err().offset == 2);

    require_ok(sub.remove("metadata.json"));
    CHECK(!mem.exists("run1/step10/metadata.json").value());
    CHECK(sub.remove("metadata.json").err().code == errc::not_found);
    CHECK(list_of(mem, "") == std::vector<std::string>{"other", "run1/step1/a",
                                                       "run1/step10/shards/__0_0.distcp",
                                                       "run1/step10x"});
  }

  TEST_CASE("names and list prefixes that would leave the prefix are rejected") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    auto sub = cairn::prefixed_storage::make(mem, "a/b/").value();
    bytes out(1);
    for (const char* n : {"", "../x", "../../x", "/x", "./x", "x/", "x/../../y"}) {
      CAPTURE(n);
      CHECK(sub.put(n, pattern(1)).err().code == errc::invalid_argument);
      CHECK(sub.open_writer(n).err().code == errc::invalid_argument);
      CHECK(sub.read(n, 0, out).err().code == errc::invalid_argument);
      CHECK(sub.size(n).err().code == errc::invalid_argument);
      CHECK(sub.exists(n).err().code == errc::invalid_argument);
      CHECK(sub.remove(n).err().code == errc::invalid_argument);
    }
    for (const char* p : {"/", "../", "./x", "x//"}) {
      CAPTURE(p);
      CHECK(sub.list(p).err().code == errc::invalid_argument);
    }
    CHECK(mem.object_count() == 0);
  }

  TEST_CASE("prefixes nest, and an empty prefix is the backend itself") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    auto outer = cairn::prefixed_storage::make(mem, "root/").value();
    auto inner = cairn::prefixed_storage::make(outer, "ckpt/").value();
    require_ok(inner.put("m", pattern(5)));
    CHECK(read_all(mem, "root/ckpt/m") == pattern(5));
    CHECK(list_of(outer, "") == std::vector<std::string>{"ckpt/m"});
    CHECK(inner.describe("m") == "mem://root/ckpt/m");

    auto same = cairn::prefixed_storage::make(mem, "").value();
    CHECK(list_of(same, "") == list_of(mem, ""));
    CHECK(same.describe("x") == mem.describe("x"));
    CHECK(same.features() == cairn::memory_storage::features);
  }

  TEST_CASE("features and remove_temporaries reach the file backend under the prefix") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("a/keep.bin", pattern(3)));
    require_ok(disk.put("b/keep.bin", pattern(3)));
    const char* tmp = ".x.tmp.1234.0123456789abcdef";  // what a killed put leaves behind
    std::ofstream(d.path / "a" / tmp) << "partial";
    std::ofstream(d.path / "b" / tmp) << "partial";

    auto sub = cairn::prefixed_storage::make(disk, "a/").value();
    CHECK(sub.features() == cairn::file_storage::features);
    CHECK(sub.remove_temporaries("y").value() == 0);  // the temporary stands for a/x
    CHECK(sub.remove_temporaries("").value() == 1);
    CHECK(!fs::exists(d.path / "a" / tmp));
    CHECK(fs::exists(d.path / "b" / tmp));
    CHECK(list_of(sub, "") == std::vector<std::string>{"keep.bin"});

    cairn::memory_storage mem;
    auto over_mem = cairn::prefixed_storage::make(mem, "a/").value();
    CHECK(over_mem.remove_temporaries("").value() == 0);
  }
}
