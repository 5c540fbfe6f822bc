// Tests of cairn/storage/s3/errors.hpp: redaction of credential material (whole, encoded, echoed
// in pieces, named fields, signature-shaped hex), the bounds of safe_server_text and the shape
// check of S3 error codes. (tests/system/s3/hostile_s3.cpp runs it against an echoing server.)
#include "cairn/storage/s3/errors.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_SUITE("s3 errors") {
  TEST_CASE("redact_all replaces every occurrence, also when the text is a piece of the mark") {
    std::string t = "key=abc, again abc and abcabc";
    cairn::detail::redact_all(t, "abc");
    CHECK(t == "key=[redacted], again [redacted] and [redacted][redacted]");
    std::string same = "abc";
    cairn::detail::redact_all(same, "");
    CHECK(same == "abc");
    // "d" and "act" occur inside "[redacted]": replacing must not loop or eat its own marks.
    std::string d = "d d";
    cairn::detail::redact_all(d, "d");
    CHECK(d == "[redacted] [redacted]");
    std::string r = "react";
    cairn::detail::redact_all(r, "[redacted]");
    CHECK(r == "react");
  }

  TEST_CASE("a secret is redacted whole, percent-encoded and as pieces of 16 or more") {
    const std::string secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";  // 40 characters
    auto red = [&](std::string t) {
      cairn::detail::redact_secret(t, secret);
      return t;
    };
    CHECK(red("k=" + secret + ";") == "k=[redacted];");
    CHECK(red("u=wJalrXUtnFEMI%2FK7MDENG%2BbPxRfiCYEXAMPLEKEY&") == "u=[redacted]&");
    // A truncated echo: the first 16 characters, grown as far as it matches (to 20 here).
    CHECK(red("start=" + secret.substr(0, 20) + "XYZ") == "start=[redacted]XYZ");
    // The last 16, and a piece from the middle.
    CHECK(red(secret.substr(24) + ".") == "[redacted].");
    CHECK(red("(" + secret.substr(10, 17) + ")") == "([redacted])");
    // 15 characters of it are left alone: a piece that short may be ordinary text.
    CHECK(red(secret.substr(3, 15)) == secret.substr(3, 15));
    // A short secret is only redacted whole.
    std::string t = "abcdefgh and abcdefg";
    cairn::detail::redact_secret(t, "abcdefgh");
    CHECK(t == "[redacted] and abcdefg");
  }

  TEST_CASE("values of credential fields are redacted in any case and shape, names stay") {
    auto red = [](std::string t) {
      cairn::detail::redact_named_values(t);
      return t;
    };
    CHECK(red("Authorization: AWS4-HMAC-SHA256 Credential=AK/x, Signature=ab\nnext: 1") ==
          "Authorization: [redacted]\nnext: 1");
    CHECK(red("{\"AUTHORIZATION\" : \"Bearer zzz\", \"x\": 1}") ==
          "{\"AUTHORIZATION\" : \"[redacted]\", \"x\": 1}");
    CHECK(red("x-amz-security-token=TOK EN/with space\r\nmore") ==
          "x-amz-security-token=[redacted]\r\nmore");
    CHECK(red("?X-Amz-Signature=deadbeef&X-Amz-Credential=AKID%2F2025 tail") ==
          "?X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted] tail");
    CHECK(red("SignedHeaders=host, signature=0123,x") ==
          "SignedHeaders=host, signature=[redacted],x");
    CHECK(red("aws4-hmac-sha256 credential=AKID/2025/us/s3, more<") ==
          "aws4-hmac-sha256 "
          "credential=[redacted]<");
    // A name without ':' or '=' after it is prose, not a field.
    const std::string prose = "The authorization header is malformed; Authorization missing";
    CHECK(red(prose) == prose);
    CHECK(red("Authorization:") == "Authorization:");
  }

  TEST_CASE("exactly 64 hex digits in a row are redacted, shorter and longer runs are not") {
    auto red = [](std::string t) {
      cairn::detail::redact_hex_runs(t);
      return t;
    };
    const std::string h64 = std::string(32, 'a') + std::string(32, 'F');
    CHECK(red("sig " + h64 + " end") == "sig [redacted] end");
    CHECK(red(h64) == "[redacted]");
    CHECK(red(h64 + "-" + h64) == "[redacted]-[redacted]");
    const std::string h63(63, '7'), h65(65, '7');
    CHECK(red(h63) == h63);
    CHECK(red(h65) == h65);  // an ETag or hash of another length is not a signature
  }

  TEST_CASE("safe_server_text bounds the length, drops control bytes and cuts on UTF-8") {
    const std::vector<std::string> none;
    using cairn::detail::max_server_text;
    using cairn::detail::safe_server_text;
    CHECK(safe_server_text(std::string(max_server_text, 'x'), none) ==
          std::string(max_server_text, 'x'));
    CHECK(safe_server_text(std::string(max_server_text + 1, 'x'), none) ==
          std::string(max_server_text, 'x') + "...");
    CHECK(safe_server_text("a\tb\x7f\x1b[31m", none) == "a b  [31m");
    // "é" is two bytes at 299 and 300: the cut goes before it, never between them.
    std::string u = std::string(max_server_text - 1, 'x') + "\xc3\xa9tail";
    CHECK(safe_server_text(u, none) == std::string(max_server_text - 1, 'x') + "...");
    // Only the first 4 KiB are looked at: a secret after them never reaches the message, and the
    // text is marked as cut even when what is left is short after redaction.
    const std::vector<std::string> secrets{"SECRETSECRET"};
    std::string big = "SECRETSECRET" + std::string(5000, ' ') + "SECRETSECRET";
    std::string s = safe_server_text(big, secrets);
    CHECK(s.find("SECRET") == std::string::npos);
    CHECK(s.starts_with("[redacted]"));
    CHECK(s.ends_with("..."));
    CHECK(s.size() == max_server_text + 3);
    // The Authorization header sent is redacted whole, even where no rule would catch it.
    CHECK(safe_server_text("echo: opaque-token-42", none, "opaque-token-42") == "echo: [redacted]");
  }

  TEST_CASE("s3_error_code_of keeps only codes shaped like S3's") {
    using cairn::detail::s3_error_code_of;
    CHECK(s3_error_code_of("NoSuchKey") == "NoSuchKey");
    CHECK(s3_error_code_of("Slow.Down_2-x") == "Slow.Down_2-x");
    CHECK(s3_error_code_of(std::string(64, 'A')) == std::string(64, 'A'));
    CHECK(s3_error_code_of(std::string(65, 'A')).empty());
    CHECK(s3_error_code_of("").empty());
    CHECK(s3_error_code_of("No Such Key").empty());
    CHECK(s3_error_code_of("AccessDenied\n").empty());
    CHECK(s3_error_code_of("AWS4-HMAC-SHA256 Credential=AK/x").empty());
    CHECK(s3_error_code_of("\xc3\xa9").empty());
  }
}
