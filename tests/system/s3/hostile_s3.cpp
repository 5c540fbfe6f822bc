// What a hostile or faulty world sends s3_storage: a server that echoes the request's credentials
// in its error answers (errors never carry them), endpoints that are not http(s) (`file://`
// writes local files: refused), and a bucket that does not exist (a clear errc::not_found naming
// it, not "incomplete checkpoint").
#include <doctest/doctest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cairn/storage/s3.hpp"
#include "tests/system/s3/s3_ranks.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_s3_test;

namespace {

std::vector<std::byte> bytes_of(std::size_t n) { return std::vector<std::byte>(n, std::byte{7}); }

/// The first 16-character piece of `secret` found in `text`, or "".
std::string piece_of(const std::string& text, const std::string& secret) {
  for (std::size_t i = 0; i + 16 <= secret.size(); ++i) {
    if (text.find(secret.substr(i, 16)) != std::string::npos) return secret.substr(i, 16);
  }
  return text.find(secret) != std::string::npos ? secret : std::string();
}

/// Whether `text` holds a run of 64 hex digits (the shape of a SigV4 signature).
bool has_signature_shape(const std::string& text) {
  std::size_t run = 0;
  for (char c : text) {
    run = std::isxdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    if (run >= 64) return true;
  }
  return false;
}

/// Checks that an error text carries no credential material.
void check_clean(const std::string& text,
                 const std::string& secret,
                 const std::string& token,
                 const std::string& access_key) {
  CAPTURE(text);
  CHECK(piece_of(text, secret).empty());
  CHECK(piece_of(text, token).empty());
  CHECK(text.find(cairn::detail::sigv4::uri_encode(token, false).substr(0, 16)) ==
        std::string::npos);
  CHECK(!has_signature_shape(text));
  CHECK(text.find("Credential=" + access_key) == std::string::npos);
  CHECK(text.find("AWS4-HMAC-SHA256 Credential") == std::string::npos);
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::size_t sig = lower.find("signature=");
  if (sig != std::string::npos) CHECK(lower.compare(sig + 10, 10, "[redacted]") == 0);
  // Bounded: the server's 10 000 bytes of filler do not make it through.
  CHECK(text.size() < 1500);
  CHECK(text.find('\n') == std::string::npos);
}

}  // namespace

TEST_SUITE("s3_storage against a hostile world") {
  TEST_CASE("a server echoing the request's credentials in its errors: no error carries them") {
    if (skipped()) return;
    const std::string secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYHOSTILEKEY";
    const std::string token =
        "FQoGZXIvYXdzEJr//////////wEaDHOSTILE+TOKEN/abc=def0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        "abcdefghijklmnopqrstuvwxyz+/==";
    const std::string access_key = "AKIDHOSTILEEXAMPLE";
    node_server echo({script("echo_server.cjs"), secret});
    cairn::s3_options o = options_for(echo.endpoint());
    o.access_key = access_key;
    o.secret_key = secret;
    o.session_token = token;
    o.max_attempts = 2;
    o.part_size = 64 << 10;
    cairn::s3_storage st("s3://cairn-test/echo", o);

    std::vector<std::pair<std::string, cairn::error>> errors;
    auto keep = [&](const std::string& what, auto r) {
      REQUIRE_MESSAGE(!r, what << " unexpectedly succeeded");
      errors.emplace_back(what, r.err());
    };
    keep("put", st.put("m.json", bytes_of(10)));  // PUT: 403, echo in <Message>
    std::vector<std::byte> out(100);
    keep("read", st.read("d.bin", 0, out));  // GET: 500, retried, "gave up"
    keep("list", st.list(""));
    keep("exists", st.exists("x.bin"));  // HEAD: 403 without a body
    {
      auto w = st.open_writer("big.bin");  // POST ?uploads: 403, Authorization as <Code>
      REQUIRE(w.has_value());
      auto big = bytes_of(o.part_size);
      keep("multipart", (*w)->write_at(0, big));
    }
    for (const auto& entry : errors) {
      const auto& what = entry.first;  // CAPTURE's lambda: no structured binding before clang 16
      const auto& e = entry.second;
      CAPTURE(what);
      const std::string text = e.describe();
      MESSAGE(what << ": " << text);
      check_clean(text, secret, token, access_key);
      // Still says what happened.
      CHECK(text.find("s3://cairn-test/echo/") != std::string::npos);
      CHECK(text.find(what == "read" || what == "list" ? "status 500" : "status 403") !=
            std::string::npos);
    }
    CHECK(errors[0].second.describe().find("AccessDenied") != std::string::npos);
    CHECK(errors[1].second.describe().find("gave up after 2 attempt(s)") != std::string::npos);
    CHECK(errors[0].second.describe().find("[redacted]") != std::string::npos);
    // A secret that is a piece of "[redacted]" itself is replaced without end-less loops.
    cairn::s3_options tiny = o;
    tiny.secret_key = "d";
    tiny.session_token = "e";
    cairn::s3_storage tiny_st("s3://cairn-test/echo", tiny);
    auto tiny_put = tiny_st.put("m.json", bytes_of(3));
    REQUIRE(!tiny_put);
    CHECK(tiny_put.err().message.find("HTTP status 403") != std::string::npos);
    const std::string tiny_secrets[] = {"d", "e"};
    CHECK(cairn::detail::safe_server_text("redacted d e", tiny_secrets, "d").find("[redacted]") !=
          std::string::npos);
    // Only values are redacted: the echoed header names stay readable.
    CHECK(errors[0].second.describe().find("x-amz-security-token: [redacted]") !=
          std::string::npos);
  }

  TEST_CASE("server text in errors: credentials redacted in any shape, length bounded") {
    const std::string secret = "SECRETKEY0123456789abcdefghij",
                      token = "TOKEN/with+slash=0123456789xyz";
    const std::string sig(64, 'a');
    const std::string auth =
        "AWS4-HMAC-SHA256 Credential=AKID/20250101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=" +
        sig;
    const std::vector<std::string> secrets{secret, token, sig};
    auto safe = [&](const std::string& raw) {
      return cairn::detail::safe_server_text(raw, secrets, auth);
    };
    CHECK(safe("plain message") == "plain message");
    // AWS's own messages stay readable.
    const std::string malformed =
        "The authorization header is malformed; the region 'us-east-1' is wrong; expecting "
        "'eu-west-3'";
    CHECK(safe(malformed) == malformed);
    CHECK(safe("The request signature we calculated does not match the signature you provided.")
              .find("[redacted]") == std::string::npos);
    // Whole, percent-encoded, truncated, other-attempt and header-shaped credential material.
    for (const std::string& raw : std::vector<std::string>{
             "k=" + secret,
             "t=" + token + "!",
             "t=" + cairn::detail::sigv4::uri_encode(token, false),
             "start=" + token.substr(0, 17) + " end=" + secret.substr(secret.size() - 18),
             "Authorization: " + auth + "\nx-amz-date: 20250101T000000Z",
             std::string(
                 "{\"authorization\":\"AWS4-HMAC-SHA256 Credential=OTHER/2024/x/s3/aws4_request, "
                 "SignedHeaders=host, Signature=0123\"}"),
             "x-amz-security-token: SOMEOTHERTOKEN\n",
             "X-Amz-Signature=" + std::string(64, 'B') + "&X-Amz-Credential=AKID%2F2025",
             "sig " + std::string(64, 'c') + " end",
         }) {
      CAPTURE(raw);
      std::string s = safe(raw);
      CAPTURE(s);
      CHECK(s.find("[redacted]") != std::string::npos);
      CHECK(piece_of(s, secret).empty());
      CHECK(piece_of(s, token).empty());
      CHECK(s.find("OTHER") == std::string::npos);
      CHECK(s.find("SOMEOTHERTOKEN") == std::string::npos);
      CHECK(s.find("AKID") == std::string::npos);
      CHECK(!has_signature_shape(s));
    }
    // Bounded, control characters gone, UTF-8 not cut in the middle of a character.
    std::string long_text = std::string(299, 'x') + "\xc3\xa9" + std::string(5000, 'z') + "\n";
    std::string s = safe(long_text);
    CHECK(s == std::string(299, 'x') + "...");
    CHECK(safe("a\r\nb\x01") == "a  b ");
    // <Code> only when shaped like an S3 error code.
    CHECK(cairn::detail::s3_error_code_of("NoSuchKey") == "NoSuchKey");
    CHECK(cairn::detail::s3_error_code_of(auth).empty());
    CHECK(cairn::detail::s3_error_code_of(std::string(65, 'A')).empty());
  }

  TEST_CASE("an endpoint that is not http(s) is refused and writes nothing") {
    namespace fs = std::filesystem;
    std::string tmpl = (fs::temp_directory_path() / "cairn-s3-file-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()));
    const fs::path dir = tmpl;
    struct remove_dir {
      fs::path p;
      ~remove_dir() {
        std::error_code ec;
        fs::remove_all(p, ec);
      }
    } cleanup{dir};
    // With file:// as the endpoint, path-style URLs would be file://<parent>/<bucket>/<key>:
    // the bucket names the directory, so a put would land in it.
    const std::string bucket = dir.filename().string();
    const std::string parent = dir.parent_path().string();
    const std::vector<std::string> endpoints{
        "file://" + parent,        "FILE://" + parent,
        "ftp://127.0.0.1:1",       "gopher://127.0.0.1",
        "dict://127.0.0.1:1",      "http://user:pw@127.0.0.1:1",
        "http://127.0.0.1:1/path", "http://",
        "http://127.0.0.1:1?x=1",  "http://a\r\nX-Evil: 1"};
    for (const auto& ep : endpoints) {
      CAPTURE(ep);
      cairn::s3_options o = options_for("http://127.0.0.1:1");
      o.endpoint = ep;
      o.max_attempts = 1;
      try {
        cairn::s3_storage st("s3://" + bucket, o);
        (void)st.put("x.bin", bytes_of(5));
        CHECK_MESSAGE(false, "the endpoint was accepted");
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::invalid_argument);
        CHECK(e.err().message.find("endpoint") != std::string::npos);
        CHECK(e.err().message.find("pw") == std::string::npos);
      }
    }
    // The same from the environment.
    ::setenv("AWS_ENDPOINT_URL", ("file://" + parent).c_str(), 1);
    cairn::s3_options o = options_for("");
    o.endpoint.clear();
    CHECK_THROWS_AS(cairn::s3_storage("s3://" + bucket, o), cairn::exception);
    ::unsetenv("AWS_ENDPOINT_URL");
    CHECK_MESSAGE(fs::is_empty(dir), "a file:// endpoint wrote into " << dir);
    // Buckets that would change the host of virtual-hosted URLs; regions likewise.
    for (const char* uri : {"s3://evil.com@bkt/p", "s3://bkt:80/p", "s3://b#k/p", "s3://b%2F/p"}) {
      CAPTURE(uri);
      CHECK_THROWS_AS(cairn::s3_storage(uri, options_for("http://127.0.0.1:1")), cairn::exception);
    }
    cairn::s3_options bad_region = options_for("http://127.0.0.1:1");
    bad_region.region = "us-east-1.evil.com/";
    CHECK_THROWS_AS(cairn::s3_storage("s3://bkt", bad_region), cairn::exception);
    // What is allowed still is.
    for (const char* ep :
         {"http://127.0.0.1:1", "HTTPS://s3.example.com/", "127.0.0.1:9000", "http://[::1]:9000"}) {
      CAPTURE(ep);
      cairn::s3_options ok = options_for(ep);
      CHECK_NOTHROW(cairn::s3_storage("s3://bkt/p", ok));
    }
  }

  TEST_CASE("a bucket that does not exist is errc::not_found naming it, on load, save and HEAD") {
    if (skipped()) return;
    s3rver srv;
    const std::string want = "bucket 'no-such-bucket' does not exist at " + srv.endpoint();
    auto check_missing = [&](const cairn::error& e) {
      CAPTURE(e.describe());
      CHECK(e.describe().find(want) != std::string::npos);
    };
    cairn::s3_storage st("s3://no-such-bucket/ckpt", options_for(srv.endpoint()));

    auto m = cairn::read_metadata(st);
    REQUIRE(!m);
    CHECK(m.err().code == cairn::errc::not_found);
    check_missing(m.err());

    // HEAD answers have no body: exists(), size() and remove() resolve their 404.
    auto ex = st.exists("metadata.json");
    REQUIRE(!ex);
    CHECK(ex.err().code == cairn::errc::not_found);
    check_missing(ex.err());
    auto sz = st.size("x.bin");
    REQUIRE(!sz);
    check_missing(sz.err());
    auto rm = st.remove("x.bin");
    REQUIRE(!rm);
    check_missing(rm.err());
    // GET, PUT, list and multipart answers say NoSuchBucket.
    std::vector<std::byte> out(10);
    auto rd = st.read("x.bin", 0, out);
    REQUIRE(!rd);
    check_missing(rd.err());
    auto pt = st.put("x.bin", bytes_of(10));
    REQUIRE(!pt);
    CHECK(pt.err().code == cairn::errc::not_found);
    check_missing(pt.err());
    auto ls = st.list("");
    REQUIRE(!ls);
    check_missing(ls.err());

    // load and save, on thread ranks.
    for (int world : {1, 2}) {
      CAPTURE(world);
      std::vector<std::string> load_errors(world), save_errors(world);
      cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
        rank_state rs(comm.rank(), world, 0, false);
        auto l = cairn::try_load(rs.sd, st, comm);
        load_errors[comm.rank()] = l ? std::string() : l.err().describe();
        rank_state ws(comm.rank(), world, 0, true);
        auto s = cairn::try_save(ws.sd, st, comm);
        save_errors[comm.rank()] = s ? std::string() : s.err().describe();
      });
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        MESSAGE("world " << world << " rank " << r << " load: " << load_errors[r]);
        MESSAGE("world " << world << " rank " << r << " save: " << save_errors[r]);
        CHECK(load_errors[r].find(want) != std::string::npos);
        CHECK(load_errors[r].find("incomplete checkpoint") == std::string::npos);
        CHECK(save_errors[r].find(want) != std::string::npos);
      }
    }

    // An existing bucket: a missing object is just missing, and the bucket is checked once.
    cairn::s3_storage good("s3://" + srv.bucket + "/p", options_for(srv.endpoint()));
    CHECK(good.exists("a.bin").value() == false);
    const auto before = good.counters().requests;
    CHECK(good.exists("b.bin").value() == false);
    CHECK(good.counters().requests - before == 1);
    auto gm = cairn::read_metadata(good);
    REQUIRE(!gm);
    CHECK(gm.err().code == cairn::errc::not_found);  // nothing under the prefix
  }
}
