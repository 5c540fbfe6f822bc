// Object-name rules (storage/names.hpp): object_name_problem, check_object_name and
// check_list_prefix accept exactly the names and prefixes they document, and their errors are
// errc::invalid_argument naming what was rejected.
#include "cairn/storage/names.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "cairn/core/error.hpp"

TEST_SUITE("names") {
  TEST_CASE("valid object names are accepted") {
    using namespace std::string_view_literals;
    for (std::string_view name : {"a"sv, "a/b/c.bin"sv, ".hidden"sv, "..a"sv, "a.."sv, "a/.b"sv,
                                  "a/..."sv, "__0_0.distcp"sv, "x y/z"sv, "a\\b"sv}) {
      CAPTURE(name);
      CHECK(cairn::object_name_problem(name).empty());
      CHECK(cairn::check_object_name(name).has_value());
    }
  }

  TEST_CASE("invalid object names are rejected with the reason and the name") {
    using namespace std::string_view_literals;
    struct bad {
      std::string_view name;
      std::string_view reason;  // a word of object_name_problem's answer
    };
    for (bad b :
         {bad{""sv, "empty"}, bad{"/a"sv, "relative"}, bad{"/"sv, "relative"},
          bad{"a//b"sv, "empty components"}, bad{"a/"sv, "empty components"}, bad{"./a"sv, "'.'"},
          bad{"a/./b"sv, "'.'"}, bad{"."sv, "'.'"}, bad{".."sv, "'..'"}, bad{"a/../b"sv, "'..'"},
          bad{"a/.."sv, "'..'"}, bad{"a\0b"sv, "NUL"}, bad{"a/\0"sv, "NUL"}}) {
      CAPTURE(std::string(b.name));
      const std::string why = cairn::object_name_problem(b.name);
      CHECK(why.find(b.reason) != std::string::npos);
      auto r = cairn::check_object_name(b.name);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      CHECK(r.err().message.find(why) != std::string::npos);
      CHECK(r.err().message.find("\"" + std::string(b.name) + "\"") != std::string::npos);
    }
  }

  TEST_CASE("list prefixes may end in a slash or a partial component") {
    using namespace std::string_view_literals;
    for (std::string_view p : {""sv, "a"sv, "a/"sv, "a/b"sv, "a/b/"sv, "shards/__0_"sv, "."sv,
                               ".."sv, "a/."sv, "a/.."sv, "step0000"sv}) {
      CAPTURE(p);
      CHECK(cairn::check_list_prefix(p).has_value());
    }
  }

  TEST_CASE("list prefixes that no valid name starts with are rejected") {
    using namespace std::string_view_literals;
    for (std::string_view p : {"/"sv, "/a"sv, "a//"sv, "a//b"sv, "./"sv, "./a"sv, "../"sv,
                               "a/../b"sv, "a/./"sv, "//"sv, "a\0"sv, "\0"sv, "a/\0b"sv}) {
      CAPTURE(std::string(p));
      auto r = cairn::check_list_prefix(p);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      CHECK(r.err().message.find("\"" + std::string(p) + "\"") != std::string::npos);
    }
  }
}
