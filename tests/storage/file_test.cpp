// file_storage (storage/file.hpp): POSIX behaviour the conformance suite cannot see: put replaces
// the file through a temporary and a rename while writers write in place, failed puts clean up,
// errors name the path and the OS reason (permissions, directories), hostile offsets,
// remove_temporaries and is_temp_name, and lists by string prefix.
#include "cairn/storage/file.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "tests/storage/conformance.hpp"

namespace file_test {

// Every file name under `dir`, recursively.
inline std::vector<std::string> files_under(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  }
  return names;
}

inline ino_t inode_of(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_ino;
}

}  // namespace file_test

TEST_SUITE("file_storage") {
  TEST_CASE("put replaces the file by rename while a writer writes in place") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("m", text("old")));
    // A hard link keeps the old inode: a rename leaves it alone, an in-place write would not.
    fs::create_hard_link(d.path / "m", d.path / "link");
    const ino_t before = file_test::inode_of(d.path / "m");
    require_ok(disk.put("m", text("new!")));
    CHECK(read_all(disk, "m") == text("new!"));
    CHECK(read_all(disk, "link") == text("old"));
    CHECK(file_test::inode_of(d.path / "m") != before);
    CHECK(file_test::files_under(d.path).size() == 2);  // no temporary left

    // open_writer truncates the same inode and is visible before finish.
    auto w = disk.open_writer("link");
    REQUIRE(w.has_value());
    CHECK(disk.size("link").value() == 0);
    require_ok((*w)->write_at(0, text("ab")));
    CHECK(disk.exists("link").value());
    CHECK(read_all(disk, "link") == text("ab"));
    require_ok((*w)->finish());
    auto again = (*w)->finish();
    REQUIRE(!again);
    CHECK(again.err().code == errc::invalid_argument);
    CHECK(again.err().file == disk.describe("link"));
    auto late = (*w)->write_at(2, text("c"));
    REQUIRE(!late);
    CHECK(late.err().code == errc::invalid_argument);
    CHECK(late.err().message.find(disk.describe("link")) != std::string::npos);
  }

  TEST_CASE("a directory in the way: errors name the path and put cleans up") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("d/inner", text("x")));
    const std::string dir = disk.describe("d");
    auto put = disk.put("d", text("y"));
    REQUIRE(!put);
    CHECK(put.err().code == errc::io);
    CHECK(put.err().file == dir);
    CHECK(put.err().message.find("rename") != std::string::npos);
    CHECK(put.err().message.find("EISDIR") != std::string::npos);
    CHECK(file_test::files_under(d.path) == std::vector<std::string>{"inner"});

    auto w = disk.open_writer("d");
    REQUIRE(!w);
    CHECK(w.err().code == errc::io);
    CHECK(w.err().file == dir);
    CHECK(w.err().message.find("EISDIR") != std::string::npos);
    bytes out(1);
    for (auto code : {disk.read("d", 0, out).err().code, disk.size("d").err().code}) {
      CHECK(code == errc::not_found);
    }
    CHECK(disk.size("d").err().message.find("not a regular file") != std::string::npos);
    CHECK(disk.read("d", 0, out).err().file == dir);
    CHECK(!disk.exists("d").value());
    auto rm = disk.remove("d");
    REQUIRE(!rm);
    CHECK(rm.err().file == dir);
    CHECK(fs::is_directory(dir));
  }

  TEST_CASE("permissions: refused writes and reads name the path and EACCES") {
    using namespace cairn_storage_test;
    if (::geteuid() == 0) {
      MESSAGE("SKIP: root ignores file permissions");
      return;
    }
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("ro/a", text("a")));
    require_ok(disk.put("secret", text("s")));
    fs::permissions(d.path / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    fs::permissions(d.path / "secret", fs::perms::none);
    auto put = disk.put("ro/b", text("b"));
    auto w = disk.open_writer("ro/c");
    bytes out(1);
    auto read = disk.read("secret", 0, out);
    auto rm = disk.remove("ro/a");
    fs::permissions(d.path / "ro", fs::perms::owner_all);
    fs::permissions(d.path / "secret", fs::perms::owner_all);
    REQUIRE(!put);
    CHECK(put.err().code == errc::io);
    CHECK(put.err().file == disk.describe("ro/b"));
    CHECK(put.err().message.find("EACCES") != std::string::npos);
    REQUIRE(!w);
    CHECK(w.err().file == disk.describe("ro/c"));
    CHECK(w.err().message.find("EACCES") != std::string::npos);
    REQUIRE(!read);
    CHECK(read.err().code == errc::io);
    CHECK(read.err().file == disk.describe("secret"));
    CHECK(read.err().message.find("Permission denied") != std::string::npos);
    REQUIRE(!rm);
    CHECK(rm.err().code == errc::io);
    CHECK(rm.err().message.find(disk.describe("ro/a")) != std::string::npos);
    CHECK(list_of(disk, "") == std::vector<std::string>{"ro/a", "secret"});
  }

  TEST_CASE("hostile offsets are refused and short reads say where the file ends") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path};
    require_ok(disk.put("f", pattern(100)));
    const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t int64_max = std::numeric_limits<std::int64_t>::max();
    bytes out(8);
    for (std::uint64_t off : {max, max - 7, int64_max, int64_max - 7}) {
      CAPTURE(off);
      auto r = disk.read("f", off, out);
      REQUIRE(!r);
      CHECK(r.err().code == errc::invalid_argument);
      CHECK(r.err().file == disk.describe("f"));
      CHECK(*r.err().offset == off);
    }
    auto w = disk.open_writer("g");
    REQUIRE(w.has_value());
    for (std::uint64_t off : {max, int64_max}) {
      auto r = (*w)->write_at(off, out);
      REQUIRE(!r);
      CHECK(r.err().code == errc::invalid_argument);
      CHECK(*r.err().offset == off);
    }
    require_ok((*w)->finish());
    CHECK(disk.size("g").value() == 0);

    struct short_read {
      std::uint64_t offset, len, ran_out;
    };
    for (short_read s :
         {short_read{96, 8, 100}, short_read{100, 1, 100}, short_read{150, 1, 150},
          short_read{std::uint64_t{1} << 40, 8, 1ull << 40}, short_read{101, 0, 101}}) {
      CAPTURE(s.offset);
      auto r = disk.read("f", s.offset, std::span(out).first(s.len));
      REQUIRE(!r);
      CHECK(r.err().code == errc::corrupt);
      CHECK(*r.err().offset == s.ran_out);
      CHECK(r.err().message.find("the file ends at byte 100") != std::string::npos);
    }
  }

  TEST_CASE("remove_temporaries removes put's leftovers whose names start with the prefix") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path / "root"};
    CHECK(disk.remove_temporaries("").value() == 0);  // no root yet
    require_ok(disk.put("a/b/keep", pattern(1)));
    require_ok(disk.put("c/keep", pattern(1)));
    const fs::path root = disk.root();
    const std::string hex = "0123456789abcdef";
    for (const fs::path& t : {root / "a" / (".x.tmp.1." + hex), root / "a/b" / (".y.tmp.22." + hex),
                              root / (".ab.tmp.3." + hex), root / "c" / (".z.tmp.4." + hex)}) {
      std::ofstream(t) << "partial";
    }
    // Look-alikes that are objects, not temporaries.
    const std::vector<std::string> alike = {".x.tmp.1.0123",
                                            "x.tmp.1." + hex,
                                            ".x.tmp.1.0123456789ABCDEF",
                                            ".x.tmp..0123456789abcdef",
                                            ".x.tmp.1." + hex + "0",
                                            ".hidden"};
    for (const auto& n : alike) {
      CAPTURE(n);
      CHECK(!cairn::file_storage::is_temp_name(n));
      std::ofstream(root / "a" / n) << "object";
    }
    CHECK(disk.remove_temporaries("a/").value() == 2);  // a/x and a/b/y, not ab
    CHECK(disk.remove_temporaries("a").value() == 1);   // ab
    CHECK(disk.remove_temporaries("c/keep").value() == 0);
    CHECK(disk.remove_temporaries("").value() == 1);  // c/z
    std::set<std::string> left;
    for (const auto& n : file_test::files_under(root)) left.insert(n);
    std::set<std::string> want(alike.begin(), alike.end());
    want.insert("keep");
    CHECK(left == want);
    CHECK(list_of(disk, "a/").size() == alike.size() + 1);

    auto bad = disk.remove_temporaries("../");
    REQUIRE(!bad);
    CHECK(bad.err().code == errc::invalid_argument);
  }

  TEST_CASE("put's temporary names are the ones is_temp_name recognises") {
    const std::string a = cairn::detail::temp_suffix();
    const std::string b = cairn::detail::temp_suffix();
    CHECK(a != b);
    CHECK(a.starts_with(std::to_string(::getpid()) + "."));
    CHECK(cairn::file_storage::is_temp_name(".metadata.json.tmp." + a));
    CHECK(cairn::file_storage::is_temp_name(".a.tmp.b.tmp." + b));
    CHECK(!cairn::file_storage::is_temp_name(".tmp." + a));
    CHECK(!cairn::file_storage::is_temp_name("metadata.json.tmp." + a));
    CHECK(!cairn::file_storage::is_temp_name(".m.tmp." + a + "."));
  }

  TEST_CASE("file lists match string prefixes and never show directories") {
    using namespace cairn_storage_test;
    temp_dir d;
    cairn::file_storage disk{d.path, /*fd_cache_size=*/0};
    for (const char* n : {"a.bin", "a/b.bin", "ab/c", "b"}) require_ok(disk.put(n, pattern(2)));
    fs::create_directories(d.path / "a" / "empty" / "deeper");
    CHECK(list_of(disk, "a") == std::vector<std::string>{"a.bin", "a/b.bin", "ab/c"});
    CHECK(list_of(disk, "a/") == std::vector<std::string>{"a/b.bin"});
    CHECK(list_of(disk, "a/e").empty());
    CHECK(list_of(disk, "a.bin/").empty());  // a file is no folder
    CHECK(list_of(disk, "zz/y/").empty());
    CHECK(list_of(disk, "").size() == 4);
    // Without an fd cache, reads still see a replaced file.
    require_ok(disk.put("b", pattern(2, 9)));
    CHECK(read_all(disk, "b") == pattern(2, 9));
  }
}
