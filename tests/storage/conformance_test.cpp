// The storage conformance suite: every backend runs the same cases through storage_ref, followed
// by cases for what only one backend offers (file layout, memory test hooks, fault injection).
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

#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"

namespace fs = std::filesystem;
using cairn::errc;
using bytes = std::vector<std::byte>;

namespace {

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
bytes pattern(std::size_t n, std::uint32_t seed = 1) {
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

bytes text(std::string_view s) {
  bytes b(s.size());
  std::transform(s.begin(), s.end(), b.begin(), [](char c) { return static_cast<std::byte>(c); });
  return b;
}

bytes read_all(cairn::storage_ref s, std::string_view name) {
  auto n = s.size(name);
  REQUIRE_MESSAGE(n.has_value(), n.err().describe());
  bytes out(*n);
  auto r = s.read(name, 0, out);
  REQUIRE_MESSAGE(r.has_value(), r.err().describe());
  return out;
}

void require_ok(const cairn::result<void>& r) {
  REQUIRE_MESSAGE(r.has_value(), r.err().describe());
}

std::vector<std::string> list_of(cairn::storage_ref s, std::string_view prefix) {
  auto l = s.list(prefix);
  REQUIRE_MESSAGE(l.has_value(), l.err().describe());
  return *l;
}

// ---- the fixtures every conformance case runs over ----

struct file_fixture {
  static constexpr bool writer_hidden_until_finish = false;
  temp_dir dir;
  cairn::file_storage backend{dir.path / "root"};
  cairn::storage_ref ref() { return backend; }
};

struct memory_fixture {
  static constexpr bool writer_hidden_until_finish = true;
  cairn::memory_storage backend;
  cairn::storage_ref ref() { return backend; }
};

// The fault injector, unarmed, must be invisible.
struct faulty_file_fixture {
  static constexpr bool writer_hidden_until_finish = false;
  temp_dir dir;
  cairn::file_storage inner{dir.path / "root"};
  cairn::faulty_storage<cairn::file_storage> backend{inner};
  cairn::storage_ref ref() { return backend; }
};

struct faulty_memory_fixture {
  static constexpr bool writer_hidden_until_finish = true;
  cairn::memory_storage inner;
  cairn::faulty_storage<cairn::memory_storage> backend{inner};
  cairn::storage_ref ref() { return backend; }
};

}  // namespace

#define CAIRN_BACKENDS file_fixture, memory_fixture, faulty_file_fixture, faulty_memory_fixture

TEST_SUITE("storage conformance") {
  TEST_CASE_TEMPLATE("put then read round-trips", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    bytes data = pattern(1000);
    require_ok(s.put("a.bin", data));
    CHECK(s.size("a.bin").value() == 1000);
    CHECK(s.exists("a.bin").value());
    CHECK(read_all(s, "a.bin") == data);
  }

  TEST_CASE_TEMPLATE("put replaces the whole object", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("m.json", pattern(5000, 1)));
    require_ok(s.put("m.json", pattern(300, 2)));
    CHECK(s.size("m.json").value() == 300);
    CHECK(read_all(s, "m.json") == pattern(300, 2));
    require_ok(s.put("m.json", pattern(7000, 3)));
    CHECK(read_all(s, "m.json") == pattern(7000, 3));
  }

  TEST_CASE_TEMPLATE("concurrent readers never see a mix of old and new", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    constexpr std::size_t n = 64 * 1024;
    require_ok(s.put("obj", bytes(n, std::byte{0})));
    std::atomic<bool> done{false};
    std::atomic<int> mixed{0}, failed{0}, reads{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&] {
        bytes out(n);
        while (!done.load()) {
          if (!s.read("obj", 0, out)) {
            ++failed;
            continue;
          }
          ++reads;
          if (std::count(out.begin(), out.end(), out[0]) != static_cast<std::ptrdiff_t>(n)) {
            ++mixed;
          }
        }
      });
    }
    for (int i = 1; i <= 30; ++i) {
      // Let readers run between puts so reads interleave with replacements on every backend.
      while (reads + failed < 2 * i) std::this_thread::yield();
      require_ok(s.put("obj", bytes(n, static_cast<std::byte>(i))));
    }
    done = true;
    for (auto& t : readers) t.join();
    CHECK(mixed == 0);
    CHECK(failed == 0);
    CHECK(reads > 0);
    CHECK(read_all(s, "obj") == bytes(n, std::byte{30}));
    CHECK(list_of(s, "") == std::vector<std::string>{"obj"});
  }

  TEST_CASE_TEMPLATE("reads at offsets and of ranges", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    bytes data = pattern(4096);
    require_ok(s.put("d/x.bin", data));
    struct range {
      std::uint64_t off, len;
    };
    for (range r : {range{0, 1}, range{1, 10}, range{100, 1000}, range{4095, 1}, range{0, 4096},
                    range{4096, 0}, range{17, 0}, range{2048, 2048}}) {
      CAPTURE(r.off);
      CAPTURE(r.len);
      bytes out(r.len, std::byte{0xEE});
      require_ok(s.read("d/x.bin", r.off, out));
      CHECK(std::equal(out.begin(), out.end(), data.begin() + static_cast<std::ptrdiff_t>(r.off)));
    }
  }

  TEST_CASE_TEMPLATE("a short object is a truncated error naming the object and offset", F,
                     CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("sub/short.bin", pattern(100)));
    bytes out(20);
    auto r = s.read("sub/short.bin", 90, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::corrupt);
    CHECK(r.err().message.find("truncated") != std::string::npos);
    CHECK(r.err().file == s.describe("sub/short.bin"));
    CHECK(r.err().message.find(s.describe("sub/short.bin")) != std::string::npos);
    REQUIRE(r.err().offset.has_value());
    CHECK(*r.err().offset == 100);
    CHECK(r.err().describe().find("offset=100") != std::string::npos);

    auto beyond = s.read("sub/short.bin", 150, std::span(out).first(1));
    REQUIRE(!beyond);
    CHECK(beyond.err().code == errc::corrupt);
    CHECK(*beyond.err().offset == 150);

    auto empty_beyond = s.read("sub/short.bin", 101, std::span(out).first(0));
    REQUIRE(!empty_beyond);
    CHECK(empty_beyond.err().code == errc::corrupt);
  }

  TEST_CASE_TEMPLATE("a missing object is not_found", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    bytes out(4);
    auto r = s.read("nope/missing.bin", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::not_found);
    CHECK(r.err().file == s.describe("nope/missing.bin"));
    CHECK(r.err().describe().find("missing.bin") != std::string::npos);
    auto sz = s.size("missing.bin");
    REQUIRE(!sz);
    CHECK(sz.err().code == errc::not_found);
    CHECK(!s.exists("missing.bin").value());
    auto rm = s.remove("missing.bin");
    REQUIRE(!rm);
    CHECK(rm.err().code == errc::not_found);
    // A "directory" (a prefix of other names) is not an object.
    require_ok(s.put("dir/inner.bin", pattern(3)));
    CHECK(!s.exists("dir").value());
    CHECK(!s.size("dir"));
    CHECK(s.size("dir").err().code == errc::not_found);
    CHECK(!s.read("dir", 0, std::span(out).first(0)));
  }

  TEST_CASE_TEMPLATE("a writer takes parallel positioned writes", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    constexpr std::size_t block = 64 * 1024, blocks = 64;
    bytes data = pattern(block * blocks, 7);
    auto w = s.open_writer("shards/rank0.bin");
    REQUIRE_MESSAGE(w.has_value(), w.err().describe());
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (std::size_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Thread t writes blocks t, t+4, ... from the end backwards, so the object grows
        // out of order and threads race on growth.
        for (std::size_t i = blocks; i-- > 0;) {
          if (i % 4 != t) continue;
          std::span<const std::byte> part(data.data() + i * block, block);
          if (!(*w)->write_at(i * block, part)) ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(failures == 0);
    if constexpr (F::writer_hidden_until_finish) {
      CHECK(!s.exists("shards/rank0.bin").value());
    }
    require_ok((*w)->finish());
    CHECK(s.size("shards/rank0.bin").value() == data.size());
    CHECK(read_all(s, "shards/rank0.bin") == data);

    auto again = (*w)->finish();
    CHECK(!again);
    CHECK(again.err().code == errc::invalid_argument);
    auto late = (*w)->write_at(0, std::span(data).first(1));
    CHECK(!late);
    CHECK(late.err().code == errc::invalid_argument);
  }

  TEST_CASE_TEMPLATE("a writer replaces an existing object and leaves gaps zero", F,
                     CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("w.bin", pattern(1000)));
    auto w = s.open_writer("w.bin");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(10, text("xyz")));
    require_ok((*w)->finish());
    bytes expect(13, std::byte{0});
    std::copy_n(text("xyz").begin(), 3, expect.begin() + 10);
    CHECK(read_all(s, "w.bin") == expect);
  }

  TEST_CASE_TEMPLATE("a writer dropped without finish is abandoned", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    {
      auto w = s.open_writer("abandoned.bin");
      REQUIRE(w.has_value());
      require_ok((*w)->write_at(0, pattern(100)));
    }
    if constexpr (F::writer_hidden_until_finish) {
      CHECK(!s.exists("abandoned.bin").value());
    }
    // Whatever is left behind can be replaced.
    require_ok(s.put("abandoned.bin", pattern(5)));
    CHECK(read_all(s, "abandoned.bin") == pattern(5));
  }

  TEST_CASE_TEMPLATE("size, exists and sorted list by prefix", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    CHECK(list_of(s, "").empty());  // nothing written yet (the file root does not exist)
    for (const char* n : {"b.bin", "a/x.bin", "ab.bin", "a/b/d.bin", "a/b/c.bin", "z"}) {
      require_ok(s.put(n, text(n)));
    }
    using v = std::vector<std::string>;
    CHECK(list_of(s, "") == v{"a/b/c.bin", "a/b/d.bin", "a/x.bin", "ab.bin", "b.bin", "z"});
    CHECK(list_of(s, "a/") == v{"a/b/c.bin", "a/b/d.bin", "a/x.bin"});
    CHECK(list_of(s, "a") == v{"a/b/c.bin", "a/b/d.bin", "a/x.bin", "ab.bin"});
    CHECK(list_of(s, "a/b/") == v{"a/b/c.bin", "a/b/d.bin"});
    CHECK(list_of(s, "a/b/c") == v{"a/b/c.bin"});
    CHECK(list_of(s, "a/x") == v{"a/x.bin"});
    CHECK(list_of(s, "q").empty());
    CHECK(list_of(s, "q/r/").empty());
    CHECK(list_of(s, "z/").empty());  // "z" is an object, not a directory
    CHECK(s.size("a/b/c.bin").value() == 9);
    CHECK(s.exists("a/x.bin").value());
    CHECK(!s.exists("a/y.bin").value());
  }

  TEST_CASE_TEMPLATE("list never shows put's temporary objects", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("keep.bin", pattern(10)));
    std::atomic<bool> done{false};
    std::atomic<int> bad{0};
    std::thread lister([&] {
      while (!done.load()) {
        auto l = s.list("");
        if (!l) {
          ++bad;
          continue;
        }
        for (const auto& n : *l) {
          if (n != "keep.bin" && n != "dir/hot.bin") ++bad;
        }
      }
    });
    for (int i = 0; i < 30; ++i) require_ok(s.put("dir/hot.bin", pattern(4096, i)));
    done = true;
    lister.join();
    CHECK(bad == 0);
    CHECK(list_of(s, "") == std::vector<std::string>{"dir/hot.bin", "keep.bin"});
  }

  TEST_CASE_TEMPLATE("remove", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("r/one.bin", pattern(10)));
    require_ok(s.put("r/two.bin", pattern(10)));
    bytes out(10);
    require_ok(s.read("r/one.bin", 0, out));  // (the file backend now caches an fd)
    require_ok(s.remove("r/one.bin"));
    CHECK(!s.exists("r/one.bin").value());
    auto r = s.read("r/one.bin", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::not_found);
    CHECK(list_of(s, "r/") == std::vector<std::string>{"r/two.bin"});
    auto again = s.remove("r/one.bin");
    REQUIRE(!again);
    CHECK(again.err().code == errc::not_found);
    require_ok(s.put("r/one.bin", pattern(3, 9)));
    CHECK(read_all(s, "r/one.bin") == pattern(3, 9));
  }

  TEST_CASE_TEMPLATE("names with subdirectories", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("a/b/c.bin", pattern(33)));
    CHECK(read_all(s, "a/b/c.bin") == pattern(33));
    auto w = s.open_writer("x/y/z/w.bin");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, pattern(44)));
    require_ok((*w)->finish());
    CHECK(read_all(s, "x/y/z/w.bin") == pattern(44));
    CHECK(s.describe("a/b/c.bin").find("a/b/c.bin") != std::string::npos);
  }

  TEST_CASE_TEMPLATE("invalid names are rejected", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    bytes out(1);
    for (const char* n :
         {"", "/abs.bin", "../up.bin", "a/../b.bin", "..", "a//b", "a/", "./a", "a/./b", "a/.."}) {
      CAPTURE(n);
      auto check = [&](const auto& r) {
        REQUIRE(!r);
        CHECK(r.err().code == errc::invalid_argument);
      };
      check(s.put(n, pattern(1)));
      check(s.open_writer(n));
      check(s.read(n, 0, out));
      check(s.size(n));
      check(s.exists(n));
      check(s.remove(n));
    }
    for (const char* p : {"/", "/a", "../", "a/../", "a//"}) {
      CAPTURE(p);
      auto r = s.list(p);
      REQUIRE(!r);
      CHECK(r.err().code == errc::invalid_argument);
    }
    CHECK(list_of(s, "").empty());  // nothing was written anywhere
    // Dots inside a component are ordinary characters.
    require_ok(s.put("..a/b..c/.d", pattern(2)));
    CHECK(read_all(s, "..a/b..c/.d") == pattern(2));
  }

  TEST_CASE_TEMPLATE("empty objects", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    require_ok(s.put("empty.bin", {}));
    CHECK(s.exists("empty.bin").value());
    CHECK(s.size("empty.bin").value() == 0);
    require_ok(s.read("empty.bin", 0, {}));
    bytes out(1);
    auto r = s.read("empty.bin", 0, out);
    REQUIRE(!r);
    CHECK(r.err().code == errc::corrupt);
    CHECK(*r.err().offset == 0);

    auto w = s.open_writer("empty2.bin");
    REQUIRE(w.has_value());
    require_ok((*w)->finish());
    CHECK(s.size("empty2.bin").value() == 0);
    CHECK(list_of(s, "empty") == std::vector<std::string>{"empty.bin", "empty2.bin"});
  }

  TEST_CASE_TEMPLATE("large objects", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    bytes big = pattern(8u << 20, 42);
    require_ok(s.put("big/put.bin", big));
    CHECK(read_all(s, "big/put.bin") == big);
    auto w = s.open_writer("big/writer.bin");
    REQUIRE(w.has_value());
    require_ok((*w)->write_at(0, big));
    require_ok((*w)->finish());
    CHECK(read_all(s, "big/writer.bin") == big);
    bytes mid(1 << 20);
    require_ok(s.read("big/writer.bin", 3u << 20, mid));
    CHECK(std::equal(mid.begin(), mid.end(), big.begin() + (3 << 20)));
  }

  TEST_CASE_TEMPLATE("many threads read many objects", F, CAIRN_BACKENDS) {
    F f;
    cairn::storage_ref s = f.ref();
    constexpr int objects = 80;  // more than file_storage's default fd cache (64)
    constexpr std::size_t n = 4096;
    for (int i = 0; i < objects; ++i) {
      require_ok(s.put("o/" + std::to_string(i), pattern(n, static_cast<std::uint32_t>(i))));
    }
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        bytes out(256);
        for (int k = 0; k < 400; ++k) {
          int i = static_cast<int>(rng() % objects);
          std::size_t off = rng() % (n - out.size());
          if (!s.read("o/" + std::to_string(i), off, out)) {
            ++bad;
            continue;
          }
          bytes want = pattern(n, static_cast<std::uint32_t>(i));
          if (!std::equal(out.begin(), out.end(),
                          want.begin() + static_cast<std::ptrdiff_t>(off))) {
            ++bad;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(bad == 0);
  }
}

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
