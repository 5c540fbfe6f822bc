// Tests of cairn/storage/s3/sigv4.hpp: SHA-256 and HMAC against published test vectors, RFC 3986
// encoding, canonical query strings and header values, and whole signatures against the examples
// of AWS's S3 documentation ("Signature Calculations for the Authorization Header: Transferring
// Payload in a Single Chunk"), whose signatures the AWS SDK's signer also gives.
#include "cairn/storage/s3/sigv4.hpp"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <string_view>

namespace sigv4_test {

inline std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

/// The credentials of AWS's examples.
inline cairn::detail::sigv4::credentials aws_example() {
  return {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
}

}  // namespace sigv4_test

TEST_SUITE("s3 sigv4") {
  namespace sv = cairn::detail::sigv4;

  TEST_CASE("sha256, hmac and hex give the published test vectors") {
    CHECK(sv::hex(sv::sha256(sigv4_test::bytes_of("abc"))) ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(sv::empty_payload_hash() ==
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(sv::payload_hash(sigv4_test::bytes_of("Welcome to Amazon S3.")) ==
          "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
    // RFC 4231 test case 2.
    CHECK(sv::hex(sv::hmac("Jefe", "what do ya want for nothing?")) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    const unsigned char raw[] = {0x00, 0x0f, 0xa5, 0xff};
    CHECK(sv::hex(raw) == "000fa5ff");
    CHECK(sv::hex(std::span<const unsigned char>()).empty());
  }

  TEST_CASE("uri_encode keeps only unreserved characters, and '/' when asked") {
    CHECK(sv::uri_encode("AZaz09-_.~", false) == "AZaz09-_.~");
    CHECK(sv::uri_encode("a b/c+d=e&f%", false) == "a%20b%2Fc%2Bd%3De%26f%25");
    CHECK(sv::uri_encode("a b/c", true) == "a%20b/c");
    CHECK(sv::uri_encode("\xc3\xbc\x01\x7f\xff", false) == "%C3%BC%01%7F%FF");
    CHECK(sv::uri_encode(std::string_view("\0", 1), true) == "%00");
    CHECK(sv::uri_encode("$!*'()", true) == "%24%21%2A%27%28%29");
  }

  TEST_CASE("canonical query strings are encoded, sorted by name then value, flags as name=") {
    CHECK(sv::canonical_query({}).empty());
    CHECK(sv::canonical_query({{"uploads", ""}}) == "uploads=");
    CHECK(sv::canonical_query({{"prefix", "J"}, {"max-keys", "2"}}) == "max-keys=2&prefix=J");
    // Sorted after encoding (byte order: upper case before lower case), equal names by value.
    CHECK(sv::canonical_query({{"b", "2"}, {"a", "z"}, {"a", "y"}, {"A", "0"}}) ==
          "A=0&a=y&a=z&b=2");
    CHECK(sv::canonical_query({{"uploadId", "a/b+c=d e~f"}, {"partNumber", "3"}}) ==
          "partNumber=3&uploadId=a%2Fb%2Bc%3Dd%20e~f");
  }

  TEST_CASE("canonical header values are trimmed with inner blanks collapsed") {
    CHECK(sv::canonical_header_value("  bytes=0-9 ") == "bytes=0-9");
    CHECK(sv::canonical_header_value("a \t  b\t\tc") == "a b c");
    CHECK(sv::canonical_header_value(" \t ").empty());
    CHECK(sv::canonical_header_value("").empty());
  }

  TEST_CASE("amz_date formats UTC seconds") {
    CHECK(sv::amz_date(0) == "19700101T000000Z");
    CHECK(sv::amz_date(1369353600) == "20130524T000000Z");
    CHECK(sv::amz_date(1735787045) == "20250102T030405Z");
  }

  TEST_CASE("the GET Object example: canonical request, string to sign and signature") {
    sv::request r;
    r.method = "GET";
    r.host = "examplebucket.s3.amazonaws.com";
    r.path = "/test.txt";
    r.headers = {{"Range", "bytes=0-9"}};
    r.payload_sha256 = sv::empty_payload_hash();
    auto s = sv::sign(r, sigv4_test::aws_example(), "us-east-1", "20130524T000000Z");
    CHECK(s.canonical ==
          "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
          "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
          "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(s.string_to_sign ==
          "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
          "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
    CHECK(s.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    CHECK(s.amz_date == "20130524T000000Z");
    CHECK(s.authorization ==
          "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
          "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
          "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  }

  TEST_CASE("the PUT Object, lifecycle and list examples give AWS's signatures") {
    sv::request put;
    put.method = "PUT";
    put.host = "examplebucket.s3.amazonaws.com";
    put.path = "/test%24file.text";
    put.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                   {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
    put.payload_sha256 = sv::payload_hash(sigv4_test::bytes_of("Welcome to Amazon S3."));
    CHECK(sv::sign(put, sigv4_test::aws_example(), "us-east-1", "20130524T000000Z").signature ==
          "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");

    sv::request get;
    get.method = "GET";
    get.host = "examplebucket.s3.amazonaws.com";
    get.path = "/";
    get.payload_sha256 = sv::empty_payload_hash();
    get.query = {{"lifecycle", ""}};
    CHECK(sv::sign(get, sigv4_test::aws_example(), "us-east-1", "20130524T000000Z").signature ==
          "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
    get.query = {{"prefix", "J"}, {"max-keys", "2"}};
    CHECK(sv::sign(get, sigv4_test::aws_example(), "us-east-1", "20130524T000000Z").signature ==
          "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
  }

  TEST_CASE("a session token is signed, and every input changes the signature") {
    sv::request r;
    r.method = "GET";
    r.host = "examplebucket.s3.amazonaws.com";
    r.path = "/test.txt";
    r.payload_sha256 = sv::empty_payload_hash();
    const std::string when = "20130524T000000Z";
    auto base = sv::sign(r, sigv4_test::aws_example(), "us-east-1", when);

    auto cred = sigv4_test::aws_example();
    cred.session_token = "FQoGZXIvYXdzEJr//////////wEaDOTOKEN";
    auto with_token = sv::sign(r, cred, "us-east-1", when);
    CHECK(with_token.canonical.find("\nx-amz-security-token:" + cred.session_token + "\n") !=
          std::string::npos);
    CHECK(with_token.authorization.find(
              "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,") !=
          std::string::npos);
    CHECK(with_token.signature != base.signature);
    // Neither secret appears in what is sent.
    CHECK(with_token.authorization.find(cred.secret_key) == std::string::npos);

    auto differs = [&](sv::request changed, std::string_view region, const std::string& at) {
      return sv::sign(changed, sigv4_test::aws_example(), region, at).signature != base.signature;
    };
    CHECK(differs(r, "eu-west-3", when));
    CHECK(differs(r, "us-east-1", "20130524T000001Z"));
    sv::request m = r;
    m.method = "HEAD";
    CHECK(differs(m, "us-east-1", when));
    sv::request p = r;
    p.path = "/test.txT";
    CHECK(differs(p, "us-east-1", when));
    sv::request h = r;
    h.host = "examplebucket.s3.amazonaws.com:443";
    CHECK(differs(h, "us-east-1", when));
    sv::request b = r;
    b.payload_sha256 = sv::payload_hash(sigv4_test::bytes_of("x"));
    CHECK(differs(b, "us-east-1", when));
    // Header names are case-insensitive and values canonical: these sign the same.
    sv::request a1 = r, a2 = r;
    a1.headers = {{"Range", "bytes=0-9"}};
    a2.headers = {{"RANGE", "  bytes=0-9  "}};
    CHECK(sv::sign(a1, sigv4_test::aws_example(), "us-east-1", when).signature ==
          sv::sign(a2, sigv4_test::aws_example(), "us-east-1", when).signature);
  }
}
