// Tests of cairn/storage/s3/options.hpp: what s3_options promises about its empty fields (taken
// from AWS_* environment variables, set fields winning), the default addressing, refused
// endpoints and regions, and the correction of numbers that cannot work.
#include "cairn/storage/s3/options.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>

#include "cairn/storage/s3/client.hpp"

namespace options_test {

/// Clears the AWS_* variables for its lifetime (set() sets one), and restores them after.
struct aws_env {
  std::map<std::string, std::optional<std::string>> saved;
  aws_env() {
    for (const char* n : {"AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
      const char* v = ::getenv(n);
      saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n);
    }
  }
  aws_env& set(const char* name, const char* value) {
    ::setenv(name, value, 1);
    return *this;
  }
  ~aws_env() {
    for (const auto& [n, v] : saved) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  aws_env(const aws_env&) = delete;
  aws_env& operator=(const aws_env&) = delete;
};

/// The host and canonical path a client would sign for GET of `key`.
inline std::pair<std::string, std::string> host_and_path(cairn::detail::s3_client& c,
                                                         const std::string& key) {
  cairn::detail::s3_http_request r;
  r.method = "GET";
  r.key = key;
  auto s = c.sign(r, "20250101T000000Z");
  // canonical: METHOD \n path \n query \n host:... \n
  std::size_t p0 = s.canonical.find('\n') + 1, p1 = s.canonical.find('\n', p0);
  std::size_t h0 = s.canonical.find("\nhost:") + 6, h1 = s.canonical.find('\n', h0);
  return {s.canonical.substr(h0, h1 - h0), s.canonical.substr(p0, p1 - p0)};
}

}  // namespace options_test

TEST_SUITE("s3 options") {
  using cairn::detail::s3_client;

  TEST_CASE("empty fields are taken from the environment and set fields win over it") {
    options_test::aws_env env;
    env.set("AWS_ENDPOINT_URL", "http://127.0.0.1:9999")
        .set("AWS_REGION", "eu-west-3")
        .set("AWS_DEFAULT_REGION", "ap-south-1")
        .set("AWS_ACCESS_KEY_ID", "AKIDENV")
        .set("AWS_SECRET_ACCESS_KEY", "secret-env")
        .set("AWS_SESSION_TOKEN", "token-env");
    s3_client from_env("bkt", "", cairn::s3_options{});
    CHECK(from_env.options().endpoint == "http://127.0.0.1:9999");
    CHECK(from_env.endpoint() == "http://127.0.0.1:9999");
    CHECK(from_env.options().region == "eu-west-3");  // AWS_REGION before AWS_DEFAULT_REGION
    CHECK(from_env.options().access_key == "AKIDENV");
    CHECK(from_env.options().secret_key == "secret-env");
    CHECK(from_env.options().session_token == "token-env");
    // The session token from the environment is signed.
    cairn::detail::s3_http_request r;
    r.method = "GET";
    r.key = "k";
    CHECK(from_env.sign(r, "20250101T000000Z").canonical.find("x-amz-security-token:token-env") !=
          std::string::npos);

    cairn::s3_options set;
    set.endpoint = "https://minio.local:9000";
    set.region = "us-west-2";
    set.access_key = "AKIDSET";
    set.secret_key = "secret-set";
    set.session_token = "token-set";
    s3_client mine("bkt", "", set);
    CHECK(mine.endpoint() == "https://minio.local:9000");
    CHECK(mine.options().region == "us-west-2");
    CHECK(mine.options().access_key == "AKIDSET");
    CHECK(mine.options().secret_key == "secret-set");
    CHECK(mine.options().session_token == "token-set");
  }

  TEST_CASE("the region falls back to AWS_DEFAULT_REGION, then us-east-1") {
    {
      options_test::aws_env env;
      env.set("AWS_DEFAULT_REGION", "ap-south-1");
      CHECK(s3_client("bkt", "", {}).options().region == "ap-south-1");
    }
    options_test::aws_env none;
    s3_client c("bkt", "", {});
    CHECK(c.options().region == "us-east-1");
    CHECK(c.options().access_key.empty());
    CHECK(c.options().session_token.empty());
    // No endpoint anywhere: AWS itself, over https.
    CHECK(c.endpoint() == "https://s3.us-east-1.amazonaws.com");
  }

  TEST_CASE("a bad endpoint or region is refused, from the options or the environment") {
    auto refused = [](cairn::s3_options o, const std::string& what) {
      try {
        s3_client c("bkt", "", std::move(o));
        FAIL("accepted: " << what);
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::invalid_argument);
        CHECK(e.err().message.find(what) != std::string::npos);
      }
    };
    {
      options_test::aws_env env;
      env.set("AWS_ENDPOINT_URL", "file:///tmp");
      refused({}, "bad S3 endpoint \"file:///tmp\"");
    }
    {
      options_test::aws_env env;
      env.set("AWS_REGION", "us-east-1.evil.com");
      refused({}, "bad S3 region \"us-east-1.evil.com\"");
    }
    options_test::aws_env none;
    cairn::s3_options o;
    o.endpoint = "http://127.0.0.1:1/x";
    refused(o, "bad S3 endpoint");
    o.endpoint.clear();
    o.region = "eu/west";
    refused(o, "bad S3 region \"eu/west\"");
    o.region = "a b";
    refused(o, "bad S3 region");
  }

  TEST_CASE("addressing is path-style with an endpoint and virtual-hosted without one") {
    options_test::aws_env none;
    cairn::s3_options custom;
    custom.endpoint = "http://127.0.0.1:9000";
    s3_client c1("my-bkt", "pre", custom);
    CHECK(options_test::host_and_path(c1, "pre/a b.bin") ==
          std::pair<std::string, std::string>{"127.0.0.1:9000", "/my-bkt/pre/a%20b.bin"});

    cairn::s3_options aws;
    aws.region = "eu-west-3";
    s3_client c2("my-bkt", "", aws);
    CHECK(options_test::host_and_path(c2, "a b.bin") ==
          std::pair<std::string, std::string>{"my-bkt.s3.eu-west-3.amazonaws.com", "/a%20b.bin"});

    // path_style overrides the default both ways.
    custom.path_style = false;
    s3_client c3("my-bkt", "", custom);
    CHECK(options_test::host_and_path(c3, "k").first == "my-bkt.127.0.0.1:9000");
    aws.path_style = true;
    s3_client c4("my-bkt", "", aws);
    CHECK(options_test::host_and_path(c4, "k") ==
          std::pair<std::string, std::string>{"s3.eu-west-3.amazonaws.com", "/my-bkt/k"});
  }

  TEST_CASE("a part size, request bound or attempt count that cannot work is corrected") {
    options_test::aws_env none;
    cairn::s3_options o;
    o.part_size = 0;
    o.max_concurrent_requests = 0;
    o.max_attempts = -3;
    s3_client c("bkt", "", o);
    CHECK(c.options().part_size == cairn::s3_options{}.part_size);
    CHECK(c.options().max_concurrent_requests == 1);
    CHECK(c.options().max_attempts == 1);
    o.part_size = 5 << 20;
    o.max_concurrent_requests = 3;
    o.max_attempts = 2;
    s3_client kept("bkt", "", o);
    CHECK(kept.options().part_size == std::size_t{5} << 20);
    CHECK(kept.options().max_concurrent_requests == 3);
    CHECK(kept.options().max_attempts == 2);
    o.part_size = 1 << 20;  // S3 would refuse such parts at CompleteMultipartUpload
    CHECK(s3_client("bkt", "", o).options().part_size == cairn::s3_min_part_size);
    o.allow_small_parts = true;
    CHECK(s3_client("bkt", "", o).options().part_size == std::size_t{1} << 20);
  }
}
