// Tests of cairn/storage/s3/client.hpp: s3_client's keys and paths, the signed requests it sends,
// which answers it retries and its limits, the fast failure after an unreachable server, the
// bound on requests in flight, and the errors of failed requests (status, S3 code, missing
// bucket, redaction), against a scripted server.
#include "cairn/storage/s3/client.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/storage/s3/scripted_server.hpp"

namespace client_test {

/// A server that answers `first` to the first `failures` requests, then 200 "done".
struct flaky {
  std::mutex mu;
  cairn_s3_unit::http_reply first;
  int failures = 0;
  cairn_s3_unit::http_reply next(const cairn_s3_unit::http_request&) {
    std::lock_guard lock(mu);
    if (failures > 0) {
      --failures;
      return first;
    }
    return cairn_s3_unit::http_reply{200, {}, "done", "", 0};
  }
  void set(cairn_s3_unit::http_reply r, int n) {
    std::lock_guard lock(mu);
    first = std::move(r);
    failures = n;
  }
};

inline cairn::detail::s3_http_request get(std::string key) {
  cairn::detail::s3_http_request r;
  r.method = "GET";
  r.key = std::move(key);
  return r;
}

}  // namespace client_test

TEST_SUITE("s3 client") {
  using cairn::detail::s3_client;

  TEST_CASE("keys, key prefixes, descriptions and canonical paths") {
    cairn::s3_options o = cairn_s3_unit::unit_options("http://127.0.0.1:1");
    s3_client c("bkt", "a/b", o);
    CHECK(c.bucket() == "bkt");
    CHECK(c.key_of("x/y.bin") == "a/b/x/y.bin");
    CHECK(c.key_prefix() == "a/b/");
    CHECK(c.describe("x") == "s3://bkt/a/b/x");
    CHECK(c.path_of("a b/\xc3\xbc+~.bin") == "/bkt/a%20b/%C3%BC%2B~.bin");
    CHECK(c.path_of("") == "/bkt/");
    s3_client root("bkt", "", o);
    CHECK(root.key_of("m.json") == "m.json");
    CHECK(root.key_prefix().empty());
    CHECK(root.describe("m.json") == "s3://bkt/m.json");
  }

  TEST_CASE("what is sent is what is signed") {
    cairn_s3_unit::scripted_server srv(
        [](const cairn_s3_unit::http_request&) { return cairn_s3_unit::http_reply{}; });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.session_token = "session/token+1";
    s3_client c("bkt", "p", o);
    const std::string body = "some body";
    cairn::detail::s3_http_request r;
    r.method = "PUT";
    r.key = c.key_of("dir/a b.bin");
    r.query = {{"partNumber", "2"}, {"uploadId", "x/y z"}};
    r.headers = {{"Range", "bytes=0-9"}};
    r.body = std::as_bytes(std::span(body));
    auto resp = c.perform(r, "UploadPart", "dir/a b.bin");
    REQUIRE_MESSAGE(resp.has_value(), resp.err().describe());
    CHECK(resp->status == 200);
    auto seen = srv.requests();
    REQUIRE(seen.size() == 1);
    const auto& q = seen[0];
    CHECK(q.target == "/bkt/p/dir/a%20b.bin?partNumber=2&uploadId=x%2Fy%20z");
    CHECK(q.headers.at("host") == "127.0.0.1:" + std::to_string(srv.port()));
    CHECK(q.headers.at("x-amz-content-sha256") ==
          cairn::detail::sigv4::payload_hash(std::as_bytes(std::span(body))));
    CHECK(q.headers.at("x-amz-security-token") == "session/token+1");
    CHECK(q.headers.at("range") == "bytes=0-9");
    CHECK(q.headers.count("expect") == 0);
    CHECK(q.body == body);
    // Signing the request again at the date it carried gives the Authorization it carried.
    const std::string date = q.headers.at("x-amz-date");
    REQUIRE(date.size() == 16);
    CHECK(q.headers.at("authorization") == c.sign(r, date).authorization);
    CHECK(q.headers.at("authorization")
              .starts_with("AWS4-HMAC-SHA256 Credential=AKIDUNITTEST/" + date.substr(0, 8) +
                           "/us-east-1/s3/"));
    CHECK(resp->authorization == q.headers.at("authorization"));
  }

  TEST_CASE("5xx, 429, SlowDown, RequestTimeout, InternalError and 200 errors are retried") {
    client_test::flaky f;
    cairn_s3_unit::scripted_server srv(
        [&](const cairn_s3_unit::http_request& r) { return f.next(r); });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    std::vector<std::tuple<std::string, std::string, std::string>> hook;
    o.on_request = [&](std::string_view m, std::string_view k, std::string_view q) {
      hook.emplace_back(m, k, q);
    };
    o.max_attempts = 5;
    s3_client c("bkt", "", o);
    using cairn_s3_unit::error_xml;
    for (const auto& [status, body] :
         std::vector<std::pair<int, std::string>>{{500, ""},
                                                  {503, error_xml("SlowDown", "slow")},
                                                  {502, "<html>bad gateway</html>"},
                                                  {429, ""},
                                                  {400, error_xml("RequestTimeout", "idle")},
                                                  {400, error_xml("SlowDown", "slow")},
                                                  {403, error_xml("InternalError", "odd")},
                                                  {200, error_xml("InternalError", "in a 200")}}) {
      CAPTURE(status);
      CAPTURE(body);
      f.set({status, {}, body, "", 0}, 2);
      const auto before = c.counters();
      hook.clear();
      auto r = client_test::get("k");
      r.query = {{"list-type", "2"}};
      auto resp = c.perform(r, "GET", "k");
      REQUIRE_MESSAGE(resp.has_value(), resp.err().describe());
      CHECK(resp->status == 200);
      CHECK(resp->text == "done");
      CHECK(c.counters().requests - before.requests == 3);
      CHECK(c.counters().retries - before.retries == 2);
      // The hook sees every attempt.
      CHECK(hook == std::vector<std::tuple<std::string, std::string, std::string>>(
                        3, {"GET", "k", "list-type=2"}));
    }
    for (const auto& [status, body] :
         std::vector<std::pair<int, std::string>>{{404, error_xml("NoSuchKey", "none")},
                                                  {403, error_xml("AccessDenied", "no")},
                                                  {400, error_xml("InvalidArgument", "bad")},
                                                  {412, ""},
                                                  {301, ""}}) {
      CAPTURE(status);
      f.set({status, {}, body, "", 0}, 2);
      const auto before = c.counters().requests;
      auto r = client_test::get("k");
      auto resp = c.perform(r, "GET", "k");
      REQUIRE(resp.has_value());  // an answer, not a failure to get one
      CHECK(resp->status == status);
      CHECK(c.counters().requests - before == 1);
    }
  }

  TEST_CASE("a request that gives up names key, bucket, attempts, last answer, object and rank") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request&) {
      return cairn_s3_unit::http_reply{
          503, {}, cairn_s3_unit::error_xml("SlowDown", "Please reduce your request rate."), "", 0};
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.rank = 5;
    o.max_attempts = 3;
    s3_client c("bkt", "pre", o);
    auto r = client_test::get(c.key_of("a.bin"));
    auto resp = c.perform(r, "GET", "a.bin");
    REQUIRE(!resp);
    const cairn::error& e = resp.err();
    CHECK(e.code == cairn::errc::io);
    CHECK(e.message.find("S3 GET of key \"pre/a.bin\" in bucket \"bkt\" gave up after 3 "
                         "attempt(s)") != std::string::npos);
    CHECK(e.message.find("last HTTP status 503 SlowDown: Please reduce your request rate.") !=
          std::string::npos);
    CHECK(e.file == "s3://bkt/pre/a.bin");
    CHECK(e.rank == 5);
    CHECK(srv.requests().size() == 3);
    // A smaller limit for one call (what abort uses).
    auto once = c.perform(r, "AbortMultipartUpload", "a.bin", 1);
    REQUIRE(!once);
    CHECK(once.err().message.find("gave up after 1 attempt(s)") != std::string::npos);
    CHECK(srv.requests().size() == 4);
    CHECK(c.counters().retries == 2);
  }

  TEST_CASE("after giving up on an unreachable server, requests try once until one is answered") {
    std::atomic<bool> broken{true};
    cairn_s3_unit::scripted_server srv([&](const cairn_s3_unit::http_request&) {
      cairn_s3_unit::http_reply rep;
      if (broken)
        rep.raw = "not http at all\r\n\r\n";  // a connection-level failure in libcurl
      else
        rep.status = 500;
      return rep;
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.max_attempts = 3;
    s3_client c("bkt", "", o);
    auto r = client_test::get("k");
    auto first = c.perform(r, "GET", "k");
    REQUIRE(!first);
    CHECK(first.err().message.find("gave up after 3 attempt(s)") != std::string::npos);
    CHECK(first.err().message.find(": curl: ") != std::string::npos);
    auto second = c.perform(r, "GET", "k");
    REQUIRE(!second);
    CHECK(second.err().message.find("gave up after 1 attempt(s)") != std::string::npos);
    CHECK(srv.requests().size() == 4);
    // The server answers again (500, retryable): that answer ends the fast-fail mode, so the
    // next request has all its attempts again.
    broken = false;
    auto third = c.perform(r, "GET", "k");
    REQUIRE(!third);
    CHECK(third.err().message.find("after 1 attempt(s)") != std::string::npos);
    CHECK(third.err().message.find("last HTTP status 500") != std::string::npos);
    auto fourth = c.perform(r, "GET", "k");
    REQUIRE(!fourth);
    CHECK(fourth.err().message.find("after 3 attempt(s)") != std::string::npos);
  }

  TEST_CASE("no more than max_concurrent_requests requests are in flight") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return cairn_s3_unit::http_reply{};
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.max_concurrent_requests = 2;
    s3_client c("bkt", "", o);
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 3; ++i) {
          auto r = client_test::get("k");
          auto resp = c.perform(r, "GET", "k");
          if (!resp || resp->status != 200) ++failed;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(failed == 0);
    CHECK(srv.requests().size() == 18);
    CHECK(srv.max_concurrent() >= 1);
    CHECK(srv.max_concurrent() <= 2);
    CHECK(c.counters().requests == 18);
  }

  TEST_CASE("http_error maps status and S3 code, and resolves a bare 404 with the bucket") {
    std::atomic<int> bucket_status{200};
    cairn_s3_unit::scripted_server srv([&](const cairn_s3_unit::http_request& r) {
      cairn_s3_unit::http_reply rep;
      if (r.method == "HEAD" && r.path == "/bkt/") rep.status = bucket_status;
      return rep;
    });
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.rank = 2;
    auto answer = [](long status, std::string text) {
      cairn::detail::s3_http_response resp;
      resp.status = status;
      resp.text = std::move(text);
      return resp;
    };
    using cairn_s3_unit::error_xml;
    {
      s3_client c("bkt", "p", o);
      auto e = c.http_error(answer(404, error_xml("NoSuchKey", "The key does not exist.")), "GET",
                            "p/x.bin", "x.bin");
      CHECK(e.code == cairn::errc::not_found);
      CHECK(e.message ==
            "S3 GET of key \"p/x.bin\" in bucket \"bkt\" failed: HTTP status 404 NoSuchKey: The "
            "key does not exist.");
      CHECK(e.file == "s3://bkt/p/x.bin");
      CHECK(e.rank == 2);
      auto denied = c.http_error(answer(403, error_xml("AccessDenied", "no")), "PUT", "p/x", "x");
      CHECK(denied.code == cairn::errc::io);
      CHECK(denied.message.ends_with("HTTP status 403 AccessDenied: no"));
      auto bucket = c.http_error(answer(404, error_xml("NoSuchBucket", "gone")), "PUT", "p/x", "x");
      CHECK(bucket.code == cairn::errc::not_found);
      CHECK(bucket.message == "bucket 'bkt' does not exist at " + srv.endpoint() +
                                  " (S3 PUT of key \"p/x\" answered 404 NoSuchBucket)");
      CHECK(bucket.file == "s3://bkt/p/x");
      CHECK(bucket.rank == 2);
      // Hostile bodies: a code that is not shaped like one is left out; a message is made safe.
      auto hostile = c.http_error(
          answer(500, error_xml("Evil code\nX-Injected: 1",
                                "leak " + o.secret_key + "\n" + std::string(5000, 'y'))),
          "GET", "p/x", "x");
      CAPTURE(hostile.message);
      CHECK(hostile.message.find("HTTP status 500: leak [redacted] yyy") != std::string::npos);
      CHECK(hostile.message.find("Evil") == std::string::npos);
      CHECK(hostile.message.find(o.secret_key) == std::string::npos);
      CHECK(hostile.message.size() < 600);
      CHECK(srv.requests().empty());  // none of these needed the bucket
    }
    {
      // A 404 without a code (HEAD has no body): the bucket answers, so the object is missing;
      // the bucket is looked at once.
      s3_client c("bkt", "", o);
      auto e = c.http_error(answer(404, ""), "HEAD", "x", "x");
      CHECK(e.code == cairn::errc::not_found);
      CHECK(e.message == "S3 HEAD of key \"x\" in bucket \"bkt\" failed: HTTP status 404");
      (void)c.http_error(answer(404, ""), "HEAD", "y", "y");
      CHECK(srv.requests().size() == 1);
    }
    {
      bucket_status = 404;
      s3_client c("bkt", "", o);
      auto e = c.http_error(answer(404, ""), "HEAD", "x", "x");
      CHECK(e.code == cairn::errc::not_found);
      CHECK(e.message == "bucket 'bkt' does not exist at " + srv.endpoint() +
                             " (S3 HEAD of key \"x\" and of the bucket answered 404)");
      CHECK(e.file == "s3://bkt/x");
      // 403 on the bucket (no s3:ListBucket) says it is there.
      bucket_status = 403;
      CHECK(c.check_bucket("x").has_value());
      bucket_status = 404;
      const auto before = srv.requests().size();
      CHECK(c.check_bucket("x").has_value());  // remembered
      CHECK(srv.requests().size() == before);
    }
  }
}
