// Tests of cairn/storage/s3/http.hpp: the libcurl callbacks of one exchange (headers, ranged data
// that never overflows its buffer, bounded error text, a rewindable upload body) and
// s3_http_exchange against a scripted server: methods and bodies, a lying Content-Range, HTTP(S)
// only, no redirects, time limits.
#include "cairn/storage/s3/http.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/storage/s3/scripted_server.hpp"

namespace http_test {

/// Feeds `line` to on_header as libcurl would and returns what it returned.
inline std::size_t header(cairn::detail::s3_curl_transfer& t, std::string line) {
  return cairn::detail::s3_curl_transfer::on_header(line.data(), 1, line.size(), &t);
}

inline std::size_t data(cairn::detail::s3_curl_transfer& t, std::string chunk) {
  return cairn::detail::s3_curl_transfer::on_data(chunk.data(), 1, chunk.size(), &t);
}

inline std::string text_of(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

struct curl_handle {
  CURL* h = ::curl_easy_init();
  ~curl_handle() { ::curl_easy_cleanup(h); }
};

/// One exchange of `r` with `url` on `h`, with limits short enough for tests.
inline cairn::detail::s3_http_response exchange(CURL* h,
                                                const cairn::detail::s3_http_request& r,
                                                const std::string& url,
                                                long timeout_ms = 20000) {
  cairn::detail::s3_http_limits lim;
  lim.timeout_ms = timeout_ms;
  cairn::detail::s3_http_response resp;
  cairn::detail::s3_http_exchange(h, r, url, {"x-test: yes", "Expect:"}, lim, resp);
  return resp;
}

}  // namespace http_test

TEST_SUITE("s3 http") {
  using cairn::detail::s3_curl_transfer;
  using cairn::detail::s3_http_request;
  using cairn::detail::s3_http_response;

  TEST_CASE("on_header keeps lower-case trimmed headers of the last response only") {
    s3_http_request req;
    s3_http_response resp;
    s3_curl_transfer t{&req, &resp, nullptr};
    CHECK(http_test::header(t, "HTTP/1.1 100 Continue\r\n") == 23);
    CHECK(http_test::header(t, "X-First: 1\r\n") == 12);
    CHECK(http_test::header(t, "\r\n") == 2);
    CHECK(resp.headers.at("x-first") == "1");
    http_test::header(t, "HTTP/1.1 200 OK\r\n");  // a new response: earlier headers are gone
    http_test::header(t, "Content-Type: \t text/xml  \r\n");
    http_test::header(t, "ETag:\"abc:def\"\r\n");
    http_test::header(t, "no colon here\r\n");
    http_test::header(t, "Empty:\r\n");
    CHECK(http_test::header(t, "\r\n") == 2);
    CHECK(resp.headers == std::map<std::string, std::string>{{"content-type", "text/xml"},
                                                             {"etag", "\"abc:def\""},
                                                             {"empty", ""}});
    CHECK(!resp.bogus_range);
  }

  TEST_CASE("a Content-Range ending at or past the object's size stops the transfer") {
    for (const auto& [range, bogus] : {std::pair<const char*, bool>{"bytes 0-0/0", true},
                                       {"bytes 10-19/10", true},
                                       {"bytes 5-10/10", true},
                                       {"bytes 5-9/10", false},
                                       {"bytes 0-0/1", false},
                                       {"bytes */10", false},
                                       {"garbage", false}}) {
      CAPTURE(range);
      s3_http_request req;
      s3_http_response resp;
      s3_curl_transfer t{&req, &resp, nullptr};
      http_test::header(t, "HTTP/1.1 206 Partial Content\r\n");
      http_test::header(t, std::string("Content-Range: ") + range + "\r\n");
      // Returning 0 makes libcurl stop instead of waiting for bytes that never come.
      CHECK(http_test::header(t, "\r\n") == (bogus ? 0u : 2u));
      CHECK(resp.bogus_range == bogus);
    }
  }

  TEST_CASE("on_data never writes past the buffer, and error text is bounded") {
    std::vector<std::byte> out(8, std::byte{'.'});
    s3_http_request req;
    req.out = std::span(out).first(6);
    s3_http_response resp;
    s3_curl_transfer t{&req, &resp, nullptr};
    t.decided = t.data = true;
    CHECK(http_test::data(t, "abcd") == 4);
    CHECK(!resp.overflow);
    // More than asked for: the rest is dropped (but consumed, so libcurl goes on), and flagged.
    CHECK(http_test::data(t, "efghij") == 6);
    CHECK(http_test::data(t, "klm") == 3);
    CHECK(resp.received == 6);
    CHECK(resp.overflow);
    CHECK(http_test::text_of(out) == "abcdef..");
    CHECK(resp.text.empty());

    s3_http_response err;
    s3_curl_transfer e{&req, &err, nullptr};
    e.decided = true;
    e.data = false;  // an error answer: its body is text, kept up to 1 MiB
    const std::string chunk(64 << 10, 'x');
    for (int i = 0; i < 20; ++i) CHECK(http_test::data(e, chunk) == chunk.size());
    CHECK(err.text.size() == std::size_t{1} << 20);
    CHECK(err.received == 0);
  }

  TEST_CASE("the upload body is read in pieces and rewinds only within itself") {
    const std::string body = "0123456789";
    s3_http_request req;
    req.body = std::as_bytes(std::span(body));
    s3_http_response resp;
    s3_curl_transfer t{&req, &resp, nullptr};
    char buf[4];
    auto read = [&] { return std::string(buf, s3_curl_transfer::on_read(buf, 1, sizeof buf, &t)); };
    CHECK(read() == "0123");
    CHECK(read() == "4567");
    CHECK(read() == "89");
    CHECK(read().empty());
    CHECK(s3_curl_transfer::on_seek(&t, 3, SEEK_SET) == CURL_SEEKFUNC_OK);
    CHECK(read() == "3456");
    CHECK(s3_curl_transfer::on_seek(&t, 11, SEEK_SET) == CURL_SEEKFUNC_FAIL);
    CHECK(s3_curl_transfer::on_seek(&t, -1, SEEK_SET) == CURL_SEEKFUNC_FAIL);
    CHECK(s3_curl_transfer::on_seek(&t, 0, SEEK_CUR) == CURL_SEEKFUNC_FAIL);
    CHECK(read() == "789");  // a refused seek moved nothing
    CHECK(s3_curl_transfer::on_seek(&t, 10, SEEK_SET) == CURL_SEEKFUNC_OK);
    CHECK(read().empty());
  }

  TEST_CASE("an exchange sends each method with its body and delivers ranged data") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request& r) {
      cairn_s3_unit::http_reply rep;
      if (r.method == "GET" && r.path == "/b/data") {
        rep.status = 206;
        rep.headers = {{"Content-Range", "bytes 2-12/20"}, {"ETag", "\"e1\""}};
        rep.body = "hello world";
      } else if (r.method == "GET") {
        rep.status = 404;
        rep.body = cairn_s3_unit::error_xml("NoSuchKey", "gone");
      } else if (r.method == "HEAD") {
        rep.headers = {{"Content-Length", "12345"}};  // and no body, as HTTP says
      } else {
        rep.body = "<Echo>" + r.method + ":" + r.body + "</Echo>";
      }
      return rep;
    });
    http_test::curl_handle h;
    std::vector<std::byte> out(11);
    s3_http_request get;
    get.method = "GET";
    get.out = out;
    auto g = http_test::exchange(h.h, get, srv.endpoint() + "/b/data?x=1");
    CHECK(g.curl == CURLE_OK);
    CHECK(g.status == 206);
    CHECK(g.received == 11);
    CHECK(http_test::text_of(out) == "hello world");
    CHECK(g.text.empty());
    CHECK(g.headers.at("content-range") == "bytes 2-12/20");

    // An error answer is text, and the buffer is left alone.
    std::vector<std::byte> untouched(4, std::byte{'.'});
    get.out = untouched;
    auto miss = http_test::exchange(h.h, get, srv.endpoint() + "/b/none");
    CHECK(miss.status == 404);
    CHECK(miss.received == 0);
    CHECK(miss.text.find("<Code>NoSuchKey</Code>") != std::string::npos);
    CHECK(http_test::text_of(untouched) == "....");

    // HEAD does not wait for the body its Content-Length announces; the handle is reset after.
    s3_http_request head;
    head.method = "HEAD";
    auto hd = http_test::exchange(h.h, head, srv.endpoint() + "/b/h");
    CHECK(hd.curl == CURLE_OK);
    CHECK(hd.status == 200);
    CHECK(hd.headers.at("content-length") == "12345");

    const std::string payload(100000, 'p');
    for (const char* method : {"PUT", "POST", "DELETE"}) {
      CAPTURE(method);
      s3_http_request r;
      r.method = method;
      if (std::string(method) != "DELETE") r.body = std::as_bytes(std::span(payload));
      auto resp = http_test::exchange(h.h, r, srv.endpoint() + "/b/up");
      CHECK(resp.curl == CURLE_OK);
      CHECK(resp.status == 200);
      CHECK(resp.text == "<Echo>" + std::string(method) + ":" +
                             (r.body.empty() ? std::string() : payload) + "</Echo>");
    }
    auto seen = srv.requests();
    REQUIRE(seen.size() == 6);
    CHECK(seen[0].target == "/b/data?x=1");
    CHECK(seen[0].headers.at("x-test") == "yes");
    CHECK(seen[0].headers.count("expect") == 0);
    CHECK(seen[3].method == "PUT");
    CHECK(seen[3].headers.at("content-length") == "100000");
    CHECK(seen[3].body == payload);
    CHECK(seen[4].method == "POST");
    CHECK(seen[5].method == "DELETE");
  }

  TEST_CASE("a 206 that lies about the range past the end answers at once, with no data") {
    // s3rver's answer for an empty object: "bytes 0-0/0", a Content-Length of 1, then nothing.
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request&) {
      cairn_s3_unit::http_reply rep;
      rep.raw =
          "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-0/0\r\n"
          "Content-Length: 1\r\n\r\n";
      rep.hold_ms = 30000;
      return rep;
    });
    http_test::curl_handle h;
    std::vector<std::byte> out(1);
    s3_http_request get;
    get.method = "GET";
    get.out = out;
    auto resp = http_test::exchange(h.h, get, srv.endpoint() + "/b/empty", 60000);
    CHECK(resp.curl == CURLE_OK);  // not a timeout nor a partial file
    CHECK(resp.bogus_range);
    CHECK(resp.status == 206);
    CHECK(resp.received == 0);
  }

  TEST_CASE("only http and https are spoken and no redirect is followed") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request&) {
      cairn_s3_unit::http_reply rep;
      rep.status = 301;
      rep.headers = {{"Location", "file:///etc/passwd"}};
      return rep;
    });
    http_test::curl_handle h;
    std::vector<std::byte> out(64);
    s3_http_request get;
    get.method = "GET";
    get.out = out;
    for (const char* url : {"file:///etc/passwd", "dict://127.0.0.1:1/x", "ftp://127.0.0.1:1/"}) {
      CAPTURE(url);
      auto resp = http_test::exchange(h.h, get, url);
      CHECK(resp.curl == CURLE_UNSUPPORTED_PROTOCOL);
      CHECK(!resp.curl_error.empty());
      CHECK(resp.received == 0);
    }
    auto redirected = http_test::exchange(h.h, get, srv.endpoint() + "/b/k");
    CHECK(redirected.curl == CURLE_OK);
    CHECK(redirected.status == 301);
    CHECK(redirected.received == 0);
    CHECK(srv.requests().size() == 1);
  }

  TEST_CASE("an exchange that outlives its time limit fails with the data it had") {
    cairn_s3_unit::scripted_server srv([](const cairn_s3_unit::http_request&) {
      cairn_s3_unit::http_reply rep;
      rep.raw = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc";
      rep.hold_ms = 30000;
      return rep;
    });
    http_test::curl_handle h;
    std::vector<std::byte> out(100);
    s3_http_request get;
    get.method = "GET";
    get.out = out;
    auto resp = http_test::exchange(h.h, get, srv.endpoint() + "/b/slow", 300);
    CHECK(resp.curl == CURLE_OPERATION_TIMEDOUT);
    CHECK(!resp.curl_error.empty());
    CHECK(resp.status == 200);
    CHECK(resp.received == 3);
  }
}
