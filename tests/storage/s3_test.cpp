// Tests of cairn/storage/s3.hpp, the umbrella of the S3 backend: including it registers the s3://
// scheme with open_storage before main, whose opener builds an s3_storage from the environment
// (endpoint, region, credentials) and turns what s3_storage would throw into an error naming the
// URI.
#include "cairn/storage/s3.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/storage/s3/scripted_server.hpp"

namespace s3_test {

/// Clears the AWS_* variables for its lifetime (set() sets one) and restores them after.
struct env_vars {
  std::map<std::string, std::optional<std::string>> saved;
  env_vars() {
    for (const char* n : {"AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
      const char* v = ::getenv(n);
      saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n);
    }
  }
  env_vars& set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    return *this;
  }
  ~env_vars() {
    for (const auto& [n, v] : saved) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  env_vars(const env_vars&) = delete;
  env_vars& operator=(const env_vars&) = delete;
};

}  // namespace s3_test

TEST_SUITE("s3 umbrella") {
  TEST_CASE("the s3 scheme is known to open_storage once the header is part of the program") {
    CHECK(cairn::detail::s3_scheme_registered);
    const auto schemes = cairn::storage_schemes();
    CHECK(std::find(schemes.begin(), schemes.end(), "s3") != schemes.end());
    CHECK(std::is_sorted(schemes.begin(), schemes.end()));
  }

  TEST_CASE("open_storage builds an s3_storage from the environment's endpoint and credentials") {
    cairn_s3_unit::scripted_server srv(
        [](const cairn_s3_unit::http_request&) { return cairn_s3_unit::http_reply{}; });
    s3_test::env_vars env;
    env.set("AWS_ENDPOINT_URL", srv.endpoint())
        .set("AWS_REGION", "eu-north-1")
        .set("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
        .set("AWS_SECRET_ACCESS_KEY", "from-env-secret")
        .set("AWS_SESSION_TOKEN", "from-env-token");
    auto st = cairn::open_storage("s3://bkt/ckpt/step_1");
    REQUIRE_MESSAGE(st.has_value(), st.err().describe());
    CHECK(st->describe("m.json") == "s3://bkt/ckpt/step_1/m.json");
    CHECK(st->features() == cairn::s3_storage::features);
    const std::string body = "{}";
    REQUIRE(st->put("m.json", std::as_bytes(std::span(body))).has_value());
    auto seen = srv.requests();
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].method == "PUT");
    CHECK(seen[0].path == "/bkt/ckpt/step_1/m.json");  // path-style: an endpoint is set
    CHECK(seen[0].body == body);
    CHECK(seen[0].headers.at("authorization").find("Credential=AKIDFROMENV/") != std::string::npos);
    CHECK(seen[0].headers.at("authorization").find("/eu-north-1/s3/aws4_request") !=
          std::string::npos);
    CHECK(seen[0].headers.at("x-amz-security-token") == "from-env-token");
  }

  TEST_CASE("what s3_storage refuses is an error of open_storage naming the URI, not a throw") {
    {
      s3_test::env_vars env;
      for (const char* uri : {"s3://bad@bucket/p", "s3://", "s3://b/a/../c"}) {
        CAPTURE(uri);
        auto st = cairn::open_storage(uri);
        REQUIRE(!st);
        CHECK(st.err().code == cairn::errc::invalid_argument);
        CHECK(st.err().message.find(uri) != std::string::npos);
      }
      CHECK(!cairn::detail::open_s3_uri("file:///tmp/x"));
    }
    for (const auto& [var, value, why] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"AWS_ENDPOINT_URL", "file:///etc", "bad S3 endpoint \"file:///etc\""},
             {"AWS_ENDPOINT_URL", "http://u:secret-pw@h", "[user info]@h"},
             {"AWS_REGION", "x.evil.com/", "bad S3 region"}}) {
      CAPTURE(value);
      s3_test::env_vars env;
      env.set(var, value);
      auto st = cairn::open_storage("s3://bkt/p");
      REQUIRE(!st);
      CHECK(st.err().code == cairn::errc::invalid_argument);
      CHECK(st.err().message.find(why) != std::string::npos);
      CHECK(st.err().message.find("secret-pw") == std::string::npos);
    }
  }
}
