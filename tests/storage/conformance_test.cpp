// The storage conformance suite: every backend and decorator runs the same cases through
// storage_ref, followed by cases for what only one backend offers (file layout, memory test
// hooks, fault injection). The decorators' own behaviour is in decorators_test.cpp.
#include "tests/storage/conformance.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/cached.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/storage/throttled.hpp"
#include "cairn/storage/writer_slots.hpp"

using namespace cairn_storage_test;

namespace {

// ---- the fixtures every conformance case runs over ----

struct file_fixture {
  temp_dir dir;
  cairn::file_storage backend{dir.path / "root"};
  cairn::storage_ref ref() { return backend; }
};

struct memory_fixture {
  cairn::memory_storage backend;
  cairn::storage_ref ref() { return backend; }
};

// The fault injector, unarmed, must be invisible.
struct faulty_file_fixture {
  temp_dir dir;
  cairn::file_storage inner{dir.path / "root"};
  cairn::faulty_storage<cairn::file_storage> backend{inner};
  cairn::storage_ref ref() { return backend; }
};

struct faulty_memory_fixture {
  cairn::memory_storage inner;
  cairn::faulty_storage<cairn::memory_storage> backend{inner};
  cairn::storage_ref ref() { return backend; }
};

// The other decorators must be invisible too, but for what they add.
struct throttled_memory_fixture {
  cairn::memory_storage inner;
  cairn::throttled_storage<cairn::memory_storage> backend{
      inner, {.write_bytes_per_second = 1u << 30, .read_bytes_per_second = 1u << 30}};
  cairn::storage_ref ref() { return backend; }
};

struct cached_file_fixture {
  temp_dir dir;
  cairn::file_storage inner{dir.path / "root"};
  cairn::cached_storage<cairn::file_storage> backend{inner, dir.path / "cache"};
  cairn::storage_ref ref() { return backend; }
};

// Downloads in many small reads, so that puts race with multi-read downloads.
struct cached_memory_fixture {
  temp_dir dir;
  cairn::memory_storage inner;
  cairn::cached_storage<cairn::memory_storage> backend{inner, dir.path, 4096};
  cairn::storage_ref ref() { return backend; }
};

struct slotted_file_fixture {
  temp_dir dir;
  cairn::file_storage inner{dir.path / "root"};
  cairn::writer_slot_storage<cairn::file_storage> backend{
      inner, cairn::writer_slots{1, dir.path.string()}};
  cairn::storage_ref ref() { return backend; }
};

struct slotted_memory_fixture {
  temp_dir dir;
  cairn::memory_storage inner;
  cairn::writer_slot_storage<cairn::memory_storage> backend{
      inner, cairn::writer_slots{2, dir.path.string()}};
  cairn::storage_ref ref() { return backend; }
};

// What open_storage returns, owning its backend.
struct any_memory_fixture {
  cairn::any_storage backend{cairn::memory_storage{}};
  cairn::storage_ref ref() { return backend; }
};

}  // namespace

#define CAIRN_BACKENDS                                                                            \
  file_fixture, memory_fixture, faulty_file_fixture, faulty_memory_fixture,                       \
      throttled_memory_fixture, cached_file_fixture, cached_memory_fixture, slotted_file_fixture, \
      slotted_memory_fixture, any_memory_fixture
#include "tests/storage/conformance_cases.hpp"

// ---- file_storage only ----

TEST_SUITE("file_storage") {
  TEST_CASE("the root is created on the first write, not by the constructor") {
    temp_dir d;
    fs::path root = d.path / "deep" / "er" / "root";
    cairn::file_storage disk{root};
    CHECK(disk.root() == root);
    CHECK(!fs::exists(root));
    CHECK(disk.list("")->empty());
    CHECK(!disk.exists("x").value());
    CHECK(!fs::exists(root));
    require_ok(disk.put("x", pattern(1)));
    CHECK(fs::is_directory(root));
    CHECK(disk.describe("a/b.bin") == (root / "a/b.bin").string());
  }

  TEST_CASE("put leaves no temporary files and hides stray ones from list") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    for (int i = 0; i < 5; ++i) require_ok(disk.put("sub/m.json", pattern(100, i)));
    std::vector<std::string> on_disk;
    for (auto& e : fs::recursive_directory_iterator(d.path)) {
      if (e.is_regular_file()) on_disk.push_back(e.path().filename().string());
    }
    CHECK(on_disk == std::vector<std::string>{"m.json"});

    // A crash between create and rename leaves a temp file behind: it is never listed.
    std::ofstream(d.path / "sub" / ".m.json.tmp.1234.0123456789abcdef") << "partial";
    std::ofstream(d.path / ".hidden") << "listed";  // an ordinary dot-file is an object
    CHECK(disk.list("").value() == std::vector<std::string>{".hidden", "sub/m.json"});
    CHECK(cairn::file_storage::is_temp_name(".m.json.tmp.1234.0123456789abcdef"));
    CHECK(!cairn::file_storage::is_temp_name("m.json.tmp.1234.0123456789abcdef"));
    CHECK(!cairn::file_storage::is_temp_name(".m.json.tmp.1234.0123"));
    CHECK(!cairn::file_storage::is_temp_name(".m.json.tmp.x.0123456789abcdef"));
    CHECK(!cairn::file_storage::is_temp_name(".hidden"));
  }

  TEST_CASE("errors carry the OS message and the errno name") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    bytes out(1);
    auto r = disk.read("missing.bin", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::not_found);
    CHECK(r.err().message.find("No such file or directory") != std::string::npos);
    CHECK(r.err().message.find("ENOENT") != std::string::npos);
    CHECK(r.err().file == (d.path / "missing.bin").string());

    require_ok(disk.put("plain", pattern(4)));
    auto under_file = disk.put("plain/child.bin", pattern(4));  // a parent is a file
    REQUIRE(!under_file);
    CHECK(under_file.err().code == errc::io);
    CHECK(under_file.err().message.find("ENOTDIR") != std::string::npos);
    CHECK(under_file.err().message.find("Not a directory") != std::string::npos);
    auto w = disk.open_writer("plain/child.bin");
    REQUIRE(!w);
    CHECK(w.err().message.find("ENOTDIR") != std::string::npos);
    CHECK(!disk.exists("plain/child.bin").value());
    CHECK(disk.read("plain/child.bin", 0, out).err().code == errc::not_found);
  }

  TEST_CASE("a file replaced behind the fd cache is reopened") {
    temp_dir d;
    cairn::file_storage a{d.path}, b{d.path};
    require_ok(a.put("latest", text("step_1")));
    bytes out(6);
    require_ok(a.read("latest", 0, out));
    CHECK(out == text("step_1"));
    require_ok(b.put("latest", text("step_2")));  // another process moves the pointer
    require_ok(a.read("latest", 0, out));
    CHECK(out == text("step_2"));
    require_ok(b.remove("latest"));
    CHECK(a.read("latest", 0, out).err().code == errc::not_found);
  }

  TEST_CASE("a tiny fd cache evicts under concurrent reads") {
    temp_dir d;
    cairn::file_storage disk{d.path, /*fd_cache_size=*/2};
    for (int i = 0; i < 8; ++i) require_ok(disk.put(std::to_string(i), pattern(512, i)));
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        bytes out(512);
        for (int k = 0; k < 300; ++k) {
          int i = (k * 7 + t) % 8;
          if (!disk.read(std::to_string(i), 0, out) || out != pattern(512, i)) ++bad;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(bad == 0);
  }

  TEST_CASE("no fd leaks from reads, writers and abandoned writers") {
    auto open_fds = [] {
      int n = 0;
      for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
      return n;
    };
    temp_dir d;
    int before = open_fds();
    {
      cairn::file_storage disk{d.path};
      for (int i = 0; i < 10; ++i) {
        require_ok(disk.put(std::to_string(i), pattern(10)));
        bytes out(10);
        require_ok(disk.read(std::to_string(i), 0, out));
        auto w = disk.open_writer("w" + std::to_string(i));
        REQUIRE(w.has_value());
        if (i % 2 == 0) require_ok((*w)->finish());
      }
    }
    CHECK(open_fds() == before);
  }

  TEST_CASE("a writer may outlive its storage") {
    temp_dir d;
    std::unique_ptr<cairn::object_writer> w;
    {
      cairn::file_storage disk{d.path};
      auto r = disk.open_writer("late.bin");
      REQUIRE(r.has_value());
      w = std::move(r).value();
    }
    require_ok(w->write_at(0, pattern(64)));
    require_ok(w->finish());
    cairn::file_storage again{d.path};
    CHECK(read_all(again, "late.bin") == pattern(64));
  }

  TEST_CASE("concurrent puts of one name leave exactly one whole version") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 5; ++i) {
          CHECK(disk.put("race.bin", bytes(1000, static_cast<std::byte>(t))).has_value());
        }
      });
    }
    for (auto& t : threads) t.join();
    bytes got = read_all(disk, "race.bin");
    CHECK(std::count(got.begin(), got.end(), got[0]) == 1000);
    CHECK(disk.list("").value() == std::vector<std::string>{"race.bin"});
    std::size_t entries = 0;
    for ([[maybe_unused]] auto& e : fs::directory_iterator(d.path)) ++entries;
    CHECK(entries == 1);
  }

  TEST_CASE("drop_cache flushes and drops the page cache of a file") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("a/x.bin", pattern(1 << 16)));
    require_ok(disk.put("y.bin", pattern(10)));
    require_ok(disk.drop_cache("a/x.bin"));
    require_ok(disk.drop_caches());
    CHECK(read_all(disk, "a/x.bin") == pattern(1 << 16));
    auto missing = disk.drop_cache("nope");
    REQUIRE(!missing);
    CHECK(missing.err().code == errc::not_found);
  }

  TEST_CASE("a moved file_storage keeps working") {
    temp_dir d;
    cairn::file_storage a{d.path};
    require_ok(a.put("k", pattern(5)));
    cairn::file_storage b = std::move(a);
    CHECK(read_all(b, "k") == pattern(5));
  }
}

// ---- memory_storage only ----

TEST_SUITE("memory_storage") {
  TEST_CASE("describe and test hooks") {
    cairn::memory_storage mem;
    CHECK(mem.describe("a/b") == "mem://a/b");
    require_ok(mem.put("a/b", pattern(10)));
    require_ok(mem.put("c", pattern(5)));
    CHECK(mem.object_count() == 2);
    CHECK(mem.total_bytes() == 15);

    bytes before(10);
    require_ok(mem.read("a/b", 0, before));
    CHECK(mem.corrupt_byte("a/b", 3));
    bytes after = *mem.contents("a/b");
    CHECK(after[3] == ~before[3]);
    after[3] = before[3];
    CHECK(after == before);
    CHECK(!mem.corrupt_byte("a/b", 10));
    CHECK(!mem.corrupt_byte("zz", 0));

    CHECK(mem.truncate("a/b", 4));
    CHECK(mem.size("a/b").value() == 4);
    CHECK(!mem.truncate("a/b", 4));
    CHECK(!mem.truncate("zz", 0));
    CHECK(!mem.contents("zz").has_value());
  }

  TEST_CASE("a writer publishes on finish and may outlive the storage") {
    std::unique_ptr<cairn::object_writer> w;
    {
      cairn::memory_storage mem;
      require_ok(mem.put("o", pattern(3, 1)));
      auto r = mem.open_writer("o");
      REQUIRE(r.has_value());
      w = std::move(r).value();
      require_ok(w->write_at(0, pattern(8, 2)));
      CHECK(read_all(mem, "o") == pattern(3, 1));  // the old object until finish
      require_ok(w->finish());
      CHECK(read_all(mem, "o") == pattern(8, 2));
      auto r2 = mem.open_writer("p");
      REQUIRE(r2.has_value());
      w = std::move(r2).value();
    }
    require_ok(w->write_at(0, pattern(8)));
    require_ok(w->finish());
  }
}

// ---- faulty_storage ----

TEST_SUITE("faulty_storage") {
  TEST_CASE("fails every write after n, with errc::io naming the object") {
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    cairn::storage_ref s = faulty;
    faulty.fail_after_writes(2);
    require_ok(s.put("a", pattern(10)));
    auto w = s.open_writer("b");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(10)));
    auto third = (*w)->write_at(10, pattern(10));
    REQUIRE(!third);
    CHECK(third.err().code == errc::io);
    CHECK(third.err().message.find("injected failure") != std::string::npos);
    CHECK(third.err().file == "mem://b");
    CHECK(*third.err().offset == 10);
    auto fourth = s.put("c", pattern(1));
    REQUIRE(!fourth);
    CHECK(fourth.err().code == errc::io);
    CHECK(!mem.exists("c").value());
    CHECK(faulty.writes() == 2);
    CHECK(faulty.bytes_written() == 20);

    faulty.disarm();
    require_ok(s.put("c", pattern(1)));
    faulty.fail_after_writes(0);
    CHECK(!s.put("d", pattern(1)));
  }

  TEST_CASE("counts reads and bytes, and fails reads of chosen objects") {
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    require_ok(faulty.put("x", pattern(100)));
    require_ok(faulty.put("y", pattern(100)));
    bytes out(30);
    require_ok(faulty.read("x", 0, out));
    require_ok(faulty.read("y", 50, out));
    CHECK(faulty.reads() == 2);
    CHECK(faulty.bytes_read() == 60);
    CHECK(faulty.writes() == 2);
    CHECK(faulty.bytes_written() == 200);

    faulty.fail_reads_of("y");
    auto r = faulty.read("y", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::io);
    CHECK(r.err().file == "mem://y");
    require_ok(faulty.read("x", 0, out));
    CHECK(faulty.reads() == 3);

    faulty.reset_counters();
    CHECK(faulty.reads() == 0);
    CHECK(faulty.bytes_read() == 0);
    CHECK(faulty.writes() == 0);
    CHECK(faulty.bytes_written() == 0);
    faulty.disarm();
    require_ok(faulty.read("y", 0, out));
  }

  TEST_CASE("fail_finish leaves the object unpublished") {
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    faulty.fail_finish();
    auto w = faulty.open_writer("f");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(4)));
    auto r = (*w)->finish();
    REQUIRE(!r);
    CHECK(r.err().code == errc::io);
    CHECK(!mem.exists("f").value());
  }

  TEST_CASE("wraps file_storage: counts and failures pass through storage_ref") {
    temp_dir d;
    cairn::file_storage disk{d.path};
    cairn::faulty_storage faulty{disk};
    cairn::storage_ref s = faulty;
    CHECK(s.describe("a") == disk.describe("a"));
    require_ok(s.put("a", pattern(1000)));
    CHECK(read_all(s, "a") == pattern(1000));
    CHECK(faulty.bytes_read() == 1000);
    faulty.fail_after_writes(0);
    auto r = s.put("a", pattern(5));
    REQUIRE(!r);
    CHECK(r.err().file == disk.describe("a"));
    CHECK(read_all(s, "a") == pattern(1000));  // the failed put changed nothing
  }
}
