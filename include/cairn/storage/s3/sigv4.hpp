// cairn/storage/s3/sigv4.hpp: AWS Signature Version 4 for S3 requests (OpenSSL SHA-256 and
// HMAC-SHA256), written in cairn because curl 7.88's CURLOPT_AWS_SIGV4 mis-signs S3 requests.
#pragma once

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cairn::detail::sigv4 {

/// The SHA-256 of `data`, 32 raw bytes.
inline std::array<unsigned char, 32> sha256(std::span<const std::byte> data) {
  std::array<unsigned char, 32> out{};
  ::SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data());
  return out;
}

/// HMAC-SHA256 of `msg` under `key`, 32 raw bytes.
inline std::array<unsigned char, 32> hmac(std::string_view key, std::string_view msg) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  ::HMAC(::EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

/// Lower-case hex of raw bytes.
inline std::string hex(std::span<const unsigned char> b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (unsigned char c : b) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

/// Hex SHA-256 of a payload: the value of `x-amz-content-sha256`.
inline std::string payload_hash(std::span<const std::byte> data) {
  auto h = sha256(data);
  return hex(h);
}

/// Hex SHA-256 of the empty payload.
inline const std::string& empty_payload_hash() {
  static const std::string h = payload_hash({});
  return h;
}

/// RFC 3986 percent-encoding: unreserved characters (A-Z a-z 0-9 - _ . ~) stay, every other byte
/// becomes %XX (upper-case hex). With `keep_slash`, '/' also stays (object key paths).
inline std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3 / 2);
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

/// Long-term credentials (and the session token of temporary ones).
struct credentials {
  std::string access_key;     ///< AWS_ACCESS_KEY_ID
  std::string secret_key;     ///< AWS_SECRET_ACCESS_KEY
  std::string session_token;  ///< AWS_SESSION_TOKEN (empty: none)
};

/// One request to sign. `path` is the already-encoded canonical URI ("/bucket/a%20b/c");
/// `query` holds raw (unencoded) name/value pairs, a flag such as `uploads` has an empty value;
/// `headers` holds the extra headers to sign besides host and x-amz-* (e.g. range), with any
/// case.
struct request {
  std::string method;
  std::string host;  ///< the Host header, with ":port" when not the scheme's default
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  ///< hex; see payload_hash()
};

/// The signature and the headers to send with the request.
struct signed_headers {
  std::string authorization;   ///< the Authorization header value
  std::string amz_date;        ///< x-amz-date, "YYYYMMDDTHHMMSSZ"
  std::string canonical;       ///< the canonical request (for debugging and tests)
  std::string string_to_sign;  ///< the string to sign (for debugging and tests)
  std::string signature;       ///< hex signature
};

/// "YYYYMMDDTHHMMSSZ" for a UTC time.
inline std::string amz_date(std::time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

/// The canonical query string: pairs RFC 3986-encoded (also '/' and ' '), sorted by encoded name
/// then value, joined with '&'; a pair with an empty value is "name=".
inline std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& q) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(q.size());
  for (const auto& [k, v] : q) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string s;
  for (const auto& [k, v] : enc) {
    if (!s.empty()) s += '&';
    s += k;
    s += '=';
    s += v;
  }
  return s;
}

/// Trims and collapses runs of spaces, as SigV4 canonical headers require.
inline std::string canonical_header_value(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

/// Signs `r` for service "s3" in `region` at `now` (a UTC `amz_date`). Signs host,
/// x-amz-content-sha256, x-amz-date, x-amz-security-token (when there is a session token) and
/// every header in `r.headers`.
inline signed_headers sign(const request& r,
                           const credentials& cred,
                           std::string_view region,
                           const std::string& now) {
  signed_headers out;
  out.amz_date = now;
  const std::string date = now.substr(0, 8);

  std::vector<std::pair<std::string, std::string>> hdrs;
  hdrs.emplace_back("host", r.host);
  hdrs.emplace_back("x-amz-content-sha256", r.payload_sha256);
  hdrs.emplace_back("x-amz-date", now);
  if (!cred.session_token.empty()) hdrs.emplace_back("x-amz-security-token", cred.session_token);
  for (const auto& [k, v] : r.headers) {
    std::string lk = k;
    std::transform(lk.begin(), lk.end(), lk.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    hdrs.emplace_back(std::move(lk), canonical_header_value(v));
  }
  std::sort(hdrs.begin(), hdrs.end());

  std::string canonical_headers, signed_names;
  for (const auto& [k, v] : hdrs) {
    canonical_headers += k + ':' + v + '\n';
    if (!signed_names.empty()) signed_names += ';';
    signed_names += k;
  }
  out.canonical = r.method + '\n' + r.path + '\n' + canonical_query(r.query) + '\n' +
                  canonical_headers + '\n' + signed_names + '\n' + r.payload_sha256;

  const std::string scope = date + '/' + std::string(region) + "/s3/aws4_request";
  auto creq_hash = sha256(std::as_bytes(std::span(out.canonical)));
  out.string_to_sign = "AWS4-HMAC-SHA256\n" + now + '\n' + scope + '\n' + hex(creq_hash);

  auto as_sv = [](const std::array<unsigned char, 32>& a) {
    return std::string_view(reinterpret_cast<const char*>(a.data()), a.size());
  };
  auto k_date = hmac("AWS4" + cred.secret_key, date);
  auto k_region = hmac(as_sv(k_date), region);
  auto k_service = hmac(as_sv(k_region), "s3");
  auto k_signing = hmac(as_sv(k_service), "aws4_request");
  out.signature = hex(hmac(as_sv(k_signing), out.string_to_sign));
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + cred.access_key + '/' + scope +
                      ", SignedHeaders=" + signed_names + ", Signature=" + out.signature;
  return out;
}

}  // namespace cairn::detail::sigv4
