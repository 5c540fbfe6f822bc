// Tests of cairn/storage/s3/endpoint.hpp: is_s3_uri, parse_s3_uri (bucket and prefix, names that
// could redirect requests) and parse_s3_endpoint (only http(s)://host[:port], user info hidden).
#include "cairn/storage/s3/endpoint.hpp"

#include <doctest/doctest.h>

#include <string>
#include <utility>

TEST_SUITE("s3 endpoint") {
  TEST_CASE("s3 URIs split into bucket and prefix without slashes at either end") {
    CHECK(cairn::is_s3_uri("s3://b"));
    CHECK(cairn::is_s3_uri("S3://b"));  // URI schemes are case-insensitive (open_storage too)
    CHECK(!cairn::is_s3_uri("/data/s3://b"));
    CHECK(!cairn::is_s3_uri("s3:/b"));
    using split = std::pair<std::string, std::string>;
    for (const auto& [uri, want] : {std::pair<const char*, split>{"s3://bkt", {"bkt", ""}},
                                    {"s3://bkt/", {"bkt", ""}},
                                    {"s3://bkt//", {"bkt", ""}},
                                    {"s3://my.bkt-1_x/a", {"my.bkt-1_x", "a"}},
                                    {"s3://bkt/a/b c/d///", {"bkt", "a/b c/d"}},
                                    {"S3://bkt/a", {"bkt", "a"}}}) {
      CAPTURE(uri);
      auto r = cairn::detail::parse_s3_uri(uri);
      REQUIRE_MESSAGE(r.has_value(), r.err().describe());
      CHECK(*r == want);
    }
  }

  TEST_CASE("s3 URIs that are not one or could point requests elsewhere are refused") {
    for (const char* uri : {"http://bkt/p", "s3:/bkt", "", "s3://", "s3:///p", "s3://evil.com@b/p",
                            "s3://b:443/p", "s3://b#x", "s3://b?x=1", "s3://b%2e/p", "s3://b\n/p",
                            "s3://b/a//c", "s3://b/../etc", "s3://b/a/./c", "s3://b//abs"}) {
      CAPTURE(uri);
      auto r = cairn::detail::parse_s3_uri(uri);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      // The message quotes the URI it refused.
      CHECK(r.err().message.find("\"" + std::string(uri) + "\"") != std::string::npos);
    }
    CHECK(cairn::detail::parse_s3_uri("s3:///p").err().message.find("no bucket") !=
          std::string::npos);
    CHECK(cairn::detail::parse_s3_uri("s3://b@c").err().message.find("bad bucket") !=
          std::string::npos);
    CHECK(cairn::detail::parse_s3_uri("s3://b/x/../y").err().message.find("bad prefix") !=
          std::string::npos);
  }

  TEST_CASE("endpoints default to https, lower-case the scheme and keep host and port") {
    struct want {
      const char* in;
      const char* scheme;
      const char* hostport;
    };
    for (const want& w :
         {want{"s3.example.com", "https", "s3.example.com"},
          want{"http://127.0.0.1:9000", "http", "127.0.0.1:9000"},
          want{"HTTPS://S3.Example.com/", "https", "S3.Example.com"},
          want{"HtTp://host//", "http", "host"}, want{"http://[::1]:9000", "http", "[::1]:9000"},
          want{"minio_1:9000", "https", "minio_1:9000"}}) {
      CAPTURE(w.in);
      auto r = cairn::detail::parse_s3_endpoint(w.in);
      REQUIRE_MESSAGE(r.has_value(), r.err().describe());
      CHECK(r->scheme == w.scheme);
      CHECK(r->hostport == w.hostport);
    }
  }

  TEST_CASE("endpoints with another scheme, a path, a query, user info or control bytes fail") {
    struct bad {
      std::string in;
      const char* why;
    };
    for (const bad& b :
         {bad{"file:///etc", "scheme \"file\" is not allowed"},
          bad{"FTP://h", "scheme \"FTP\" is not allowed"},
          bad{"://h", "scheme \"\" is not allowed"}, bad{"http://", "no host"},
          bad{"https:///", "no host"}, bad{"", "no host"},
          bad{"http://h:1/path", "the character '/'"}, bad{"http://h?x=1", "the character '?'"},
          bad{"http://h#frag", "the character '#'"}, bad{"http://h%2f", "the character '%'"},
          bad{"http://h x", "the character ' '"},
          bad{std::string("http://h\r\nX-Evil: 1"), "a control character"},
          bad{std::string("http://h\0x", 9), "a control character"},
          bad{"http://user@h", "user info is not allowed"}}) {
      CAPTURE(b.in);
      auto r = cairn::detail::parse_s3_endpoint(b.in);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
      CHECK(r.err().message.find("bad S3 endpoint") != std::string::npos);
      CHECK(r.err().message.find(b.why) != std::string::npos);
    }
  }

  TEST_CASE("the user info of a refused endpoint never appears in the error") {
    for (const char* ep : {"http://admin:hunter2@127.0.0.1:9000", "admin:hunter2@host",
                           "https://admin:hunter2@x@host", "ftp://admin:hunter2@host"}) {
      CAPTURE(ep);
      auto r = cairn::detail::parse_s3_endpoint(ep);
      REQUIRE(!r);
      CAPTURE(r.err().message);
      CHECK(r.err().message.find("hunter2") == std::string::npos);
      CHECK(r.err().message.find("admin") == std::string::npos);
      CHECK(r.err().message.find("[user info]@") != std::string::npos);
    }
    // The host part stays, so the error still says which server was meant.
    CHECK(cairn::detail::parse_s3_endpoint("http://u:p@10.1.2.3")
              .err()
              .message.find("\"http://[user info]@10.1.2.3\"") != std::string::npos);
  }
}
