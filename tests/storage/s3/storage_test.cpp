// Tests of cairn/storage/s3/storage.hpp: s3_storage's refusals before any request, ranged reads
// (exact, short, past the end, empty objects), HEAD-based size/exists/remove, listing relative to
// the prefix with continuation, and what it makes of hostile answers. Against s3rver (skipped
// without node) where S3's own behaviour matters, a scripted server where a lie is needed.
#include "cairn/storage/s3/storage.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tests/storage/s3/scripted_server.hpp"
#include "tests/system/s3/s3_server.hpp"

namespace storage_test {

/// One s3rver for this file's cases, started on first use; null when it cannot run here.
inline cairn_s3_test::s3rver* server() {
  static std::unique_ptr<cairn_s3_test::s3rver> srv =
      cairn_s3_test::skip_reason().empty() ? std::make_unique<cairn_s3_test::s3rver>() : nullptr;
  return srv.get();
}

inline std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

inline std::string text_of(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

inline std::string list_page(const std::vector<std::string>& keys,
                             bool truncated,
                             const std::string& token) {
  std::string x = "<ListBucketResult>";
  for (const auto& k : keys) x += "<Contents><Key>" + k + "</Key></Contents>";
  x += std::string("<IsTruncated>") + (truncated ? "true" : "false") + "</IsTruncated>";
  if (!token.empty()) x += "<NextContinuationToken>" + token + "</NextContinuationToken>";
  return x + "</ListBucketResult>";
}

}  // namespace storage_test

TEST_SUITE("s3_storage") {
  TEST_CASE("bad URIs and endpoints throw, bad names fail before any request") {
    cairn::s3_options o = cairn_s3_unit::unit_options("http://127.0.0.1:1");
    for (const char* uri : {"/tmp/x", "s3://", "s3://a@b/p", "s3://b/../p"}) {
      CAPTURE(uri);
      try {
        cairn::s3_storage s(uri, o);
        FAIL("accepted");
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::invalid_argument);
        CHECK(e.err().message.find(uri) != std::string::npos);
      }
    }
    cairn::s3_options file = o;
    file.endpoint = "file:///tmp";
    CHECK_THROWS_AS(cairn::s3_storage("s3://b/p", file), cairn::exception);

    cairn::s3_storage s("s3://b/p", o);
    CHECK(s.describe("x/y") == "s3://b/p/x/y");
    std::vector<std::byte> out(4);
    for (const char* bad : {"", "/abs", "a//b", "a/../b", "./a", "a/"}) {
      CAPTURE(bad);
      CHECK(s.put(bad, out).err().code == cairn::errc::invalid_argument);
      CHECK(s.read(bad, 0, out).err().code == cairn::errc::invalid_argument);
      CHECK(s.size(bad).err().code == cairn::errc::invalid_argument);
      CHECK(s.exists(bad).err().code == cairn::errc::invalid_argument);
      CHECK(s.remove(bad).err().code == cairn::errc::invalid_argument);
      CHECK(!s.open_writer(bad));
    }
    CHECK(s.list("/abs").err().code == cairn::errc::invalid_argument);
    CHECK(s.list("a//b/").err().code == cairn::errc::invalid_argument);
    CHECK(s.counters().requests == 0);
  }

  TEST_CASE("reads are exact ranged GETs, truncated at the object's end, not_found when missing") {
    auto* srv = storage_test::server();
    if (!srv) return (void)cairn_s3_test::skipped();
    cairn::s3_options o = cairn_s3_test::options_for(srv->endpoint());
    o.rank = 3;
    cairn::s3_storage s("s3://" + srv->bucket + "/reads", o);
    std::string data(1000, '\0');
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('a' + i % 26);
    REQUIRE(s.put("r.bin", storage_test::bytes_of(data)).has_value());
    CHECK(s.counters().puts == 1);
    CHECK(s.counters().bytes_put == 1000);

    std::vector<std::byte> ten(10);
    REQUIRE(s.read("r.bin", 990, ten).has_value());
    CHECK(storage_test::text_of(ten) == data.substr(990));
    CHECK(s.counters().gets == 1);
    CHECK(s.counters().bytes_got == 10);
    CHECK(s.read("r.bin", 1000, std::span<std::byte>()).has_value());

    // Past the end, from inside the object, at its end and beyond it: errc::corrupt at the byte
    // where the object ends (or where the read started), naming the object and the rank.
    for (const auto& [offset, at] :
         {std::pair<std::uint64_t, std::uint64_t>{995, 1000}, {1000, 1000}, {5000, 5000}}) {
      CAPTURE(offset);
      auto r = s.read("r.bin", offset, ten);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::corrupt);
      CHECK(r.err().offset == at);
      CHECK(r.err().file == "s3://" + srv->bucket + "/reads/r.bin");
      CHECK(r.err().rank == 3);
      CHECK(r.err().message.find("the object ends at byte 1000") != std::string::npos);
    }
    auto empty_past = s.read("r.bin", 1001, std::span<std::byte>());
    REQUIRE(!empty_past);
    CHECK(empty_past.err().code == cairn::errc::corrupt);

    // An empty object (s3rver answers its range with a lying "bytes 0-0/0").
    REQUIRE(s.put("empty.bin", {}).has_value());
    CHECK(s.size("empty.bin").value() == 0);
    auto e = s.read("empty.bin", 0, ten);
    REQUIRE(!e);
    CHECK(e.err().code == cairn::errc::corrupt);
    CHECK(e.err().offset == 0);

    auto missing = s.read("none.bin", 0, ten);
    REQUIRE(!missing);
    CHECK(missing.err().code == cairn::errc::not_found);
    CHECK(missing.err().file == "s3://" + srv->bucket + "/reads/none.bin");
    CHECK(missing.err().rank == 3);
  }

  TEST_CASE("size, exists and remove are HEADs, remove of a missing object is not_found") {
    auto* srv = storage_test::server();
    if (!srv) return (void)cairn_s3_test::skipped();
    cairn::s3_storage s("s3://" + srv->bucket + "/heads",
                        cairn_s3_test::options_for(srv->endpoint()));
    REQUIRE(s.put("a/b.bin", storage_test::bytes_of("12345")).has_value());
    CHECK(s.size("a/b.bin").value() == 5);
    CHECK(s.exists("a/b.bin").value());
    CHECK(!s.exists("a/c.bin").value());
    CHECK(!s.exists("a").value());  // a "directory" is no object
    auto sz = s.size("a/c.bin");
    REQUIRE(!sz);
    CHECK(sz.err().code == cairn::errc::not_found);
    CHECK(s.counters().heads == 5);

    REQUIRE(s.remove("a/b.bin").has_value());
    CHECK(s.counters().deletes == 1);
    CHECK(!s.exists("a/b.bin").value());
    auto again = s.remove("a/b.bin");
    REQUIRE(!again);
    CHECK(again.err().code == cairn::errc::not_found);
    CHECK(again.err().message == "no object s3://" + srv->bucket + "/heads/a/b.bin");
    CHECK(s.counters().deletes == 1);
  }

  TEST_CASE("list names are relative to the storage prefix and never from a sibling prefix") {
    auto* srv = storage_test::server();
    if (!srv) return (void)cairn_s3_test::skipped();
    cairn::s3_options o = cairn_s3_test::options_for(srv->endpoint());
    o.list_page_size = 2;
    cairn::s3_storage p("s3://" + srv->bucket + "/lst/p", o);
    cairn::s3_storage pp("s3://" + srv->bucket + "/lst/pp", o);
    for (const char* n : {"x/1", "x/2", "x/3", "y", "z z"})
      REQUIRE(p.put(n, storage_test::bytes_of(n)).has_value());
    REQUIRE(pp.put("x/9", storage_test::bytes_of("9")).has_value());
    CHECK(p.list("").value() == std::vector<std::string>{"x/1", "x/2", "x/3", "y", "z z"});
    CHECK(p.counters().lists == 3);  // five keys in pages of two
    CHECK(p.list("x/").value() == std::vector<std::string>{"x/1", "x/2", "x/3"});
    CHECK(p.list("x/3").value() == std::vector<std::string>{"x/3"});
    CHECK(p.list("q").value().empty());
    CHECK(pp.list("").value() == std::vector<std::string>{"x/9"});
  }

  TEST_CASE("hostile read answers: Range ignored or moved, short body, 416, lying sizes") {
    struct answer {
      int status;
      std::vector<std::pair<std::string, std::string>> headers;
      std::string body;
    };
    std::mutex mu;
    answer mode;
    std::string head_length = "15";
    cairn_s3_unit::scripted_server srv([&](const cairn_s3_unit::http_request& r) {
      std::lock_guard lock(mu);
      cairn_s3_unit::http_reply rep;
      if (r.method == "HEAD") {
        rep.raw =
            "HTTP/1.1 200 OK\r\n" +
            (head_length.empty() ? std::string() : "Content-Length: " + head_length + "\r\n") +
            "Connection: close\r\n\r\n";
        return rep;
      }
      rep.status = mode.status;
      rep.headers = mode.headers;
      rep.body = mode.body;
      return rep;
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.rank = 1;
    cairn::s3_storage s("s3://bkt/p", o);
    std::vector<std::byte> out(10);
    auto read_with = [&](answer m) {
      {
        std::lock_guard lock(mu);
        mode = std::move(m);
      }
      return s.read("k.bin", 10, out);
    };
    auto ignored = read_with({200, {}, std::string(15, 'a')});
    REQUIRE(!ignored);
    CHECK(ignored.err().code == cairn::errc::io);
    CHECK(ignored.err().message.find("ignored the Range header") != std::string::npos);
    CHECK(ignored.err().file == "s3://bkt/p/k.bin");
    CHECK(srv.requests().back().headers.at("range") == "bytes=10-19");

    auto shorter = read_with({206, {{"Content-Range", "bytes 10-14/15"}}, "abcde"});
    REQUIRE(!shorter);
    CHECK(shorter.err().code == cairn::errc::corrupt);
    CHECK(shorter.err().offset == 15);
    CHECK(shorter.err().rank == 1);
    CHECK(shorter.err().message.find("ends at byte 15") != std::string::npos);

    auto past = read_with({416, {{"Content-Range", "bytes */12"}}, ""});
    REQUIRE(!past);
    CHECK(past.err().code == cairn::errc::corrupt);
    CHECK(past.err().offset == 10);
    CHECK(past.err().message.find("ends at byte 12") != std::string::npos);
    const auto heads = s.counters().heads;
    auto sized_by_head = read_with({416, {}, ""});  // no Content-Range: a HEAD tells the size
    REQUIRE(!sized_by_head);
    CHECK(sized_by_head.err().message.find("ends at byte 15") != std::string::npos);
    CHECK(s.counters().heads == heads + 1);

    // The answer must be the range asked for, not another one.
    auto elsewhere = read_with({206, {{"Content-Range", "bytes 0-9/15"}}, "0123456789"});
    REQUIRE(!elsewhere);
    CHECK(elsewhere.err().code == cairn::errc::io);
    CHECK(elsewhere.err().offset == 10);
    CHECK(elsewhere.err().message.find(
              "asked for bytes 10-19 and was answered bytes starting at 0") != std::string::npos);
    // Bytes past the range are dropped; the range's own bytes arrived first.
    auto longer = read_with({206, {{"Content-Range", "bytes 10-19/30"}}, "0123456789abcd"});
    REQUIRE_MESSAGE(longer.has_value(), longer.err().describe());
    CHECK(std::string(reinterpret_cast<const char*>(out.data()), out.size()) == "0123456789");
    // A range past the end of what 64 bits can address is refused before any request.
    const auto sent = srv.requests().size();
    auto wraps = s.read("k.bin", UINT64_MAX - 2, out);
    REQUIRE(!wraps);
    CHECK(wraps.err().code == cairn::errc::invalid_argument);
    CHECK(srv.requests().size() == sent);

    auto denied = read_with({403, {}, cairn_s3_unit::error_xml("AccessDenied", "no")});
    REQUIRE(!denied);
    CHECK(denied.err().code == cairn::errc::io);
    CHECK(denied.err().message.find("HTTP status 403 AccessDenied: no") != std::string::npos);

    // A HEAD answer without Content-Length, or with one that is not a size, gives no size (curl
    // refuses some of these itself, cairn the rest).
    for (const char* length : {"abc", "-1", "12x", "99999999999999999999999"}) {
      CAPTURE(length);
      {
        std::lock_guard lock(mu);
        head_length = length;
      }
      auto bad = s.size("k.bin");
      REQUIRE(!bad);
      CHECK(bad.err().code == cairn::errc::io);
      CHECK_MESSAGE(bad.err().message.find("Content-Length") != std::string::npos,
                    bad.err().message);
    }
    {
      std::lock_guard lock(mu);
      head_length.clear();
    }
    auto sz = s.size("k.bin");
    REQUIRE(!sz);
    CHECK(sz.err().code == cairn::errc::io);
    CHECK(sz.err().message.find("returned no Content-Length") != std::string::npos);
  }

  TEST_CASE("list follows continuation tokens to the last page") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request& r) {
      cairn_s3_unit::http_reply rep;
      const std::string token = r.param("continuation-token");
      if (token.empty())
        rep.body = storage_test::list_page({"p/b", "p/a", "other/x"}, true, "t/1 +=&amp;");
      else if (token == "t%2F1%20%2B%3D%26")
        rep.body = storage_test::list_page({"p/c", "p/a", "p/d &amp; e"}, false, "");
      else
        rep.status = 400;
      return rep;
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.list_page_size = 3;
    cairn::s3_storage s("s3://bkt/p", o);
    auto names = s.list("");
    REQUIRE_MESSAGE(names.has_value(), names.err().describe());
    // Sorted, each once, outside the prefix dropped, entities decoded.
    CHECK(*names == std::vector<std::string>{"a", "b", "c", "d & e"});
    auto seen = srv.requests();
    REQUIRE(seen.size() == 2);
    CHECK(seen[0].param("list-type") == "2");
    CHECK(seen[0].param("prefix") == "p%2F");
    CHECK(seen[0].param("max-keys") == "3");
    CHECK(s.counters().lists == 2);
  }

  TEST_CASE("a listing cut short or looping is an error, never a partial list") {
    // A truncated page without a token would hide the rest of the objects (checkpoints from a
    // scan, old ones from retention); a token given twice would list forever.
    for (const bool repeat : {false, true}) {
      CAPTURE(repeat);
      cairn_s3_unit::scripted_server srv([repeat](const cairn_s3_unit::http_request& r) {
        cairn_s3_unit::http_reply rep;
        const std::string token = r.param("continuation-token");
        if (token.empty())
          rep.body = storage_test::list_page({"p/a"}, true, "t1");
        else if (token == "t1")
          rep.body = storage_test::list_page({"p/b"}, true, repeat ? "t1" : "");
        else
          rep.status = 400;
        return rep;
      });
      cairn::s3_storage s("s3://bkt/p", cairn_s3_unit::unit_options(srv.endpoint()));
      auto names = s.list("");
      REQUIRE(!names);
      CHECK(names.err().code == cairn::errc::io);
      CHECK(names.err().message.find(repeat
                                         ? "gave a continuation token it had given before"
                                         : "gave no NextContinuationToken") != std::string::npos);
      CHECK(srv.requests().size() == 2);
    }
  }
}
