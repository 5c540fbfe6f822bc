// cairn/storage/s3/http.hpp: one HTTP exchange with an S3 server over a libcurl easy handle: the
// request and response records, the transfer callbacks (headers, ranged bodies, uploads) and the
// handle's settings (HTTP(S) only, no redirects, timeouts). Signing and retries are the client's
// (s3/client.hpp).
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cairn::detail {

/// A header value that must be a decimal count (Content-Length, a Content-Range bound): its
/// value, or nothing when it is empty, holds anything but digits, or does not fit 64 bits.
inline std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

/// One HTTP request to the store.
struct s3_http_request {
  std::string method;  ///< GET, PUT, HEAD, POST, DELETE
  std::string key;     ///< full object key (raw); empty for bucket-level requests
  std::vector<std::pair<std::string, std::string>> query;    ///< raw pairs
  std::vector<std::pair<std::string, std::string>> headers;  ///< signed extra headers
  std::span<const std::byte> body;                           ///< request body (PUT/POST)
  std::string body_sha256;   ///< hex SHA-256 of body (computed when empty)
  std::span<std::byte> out;  ///< GET: where the object bytes go (ranged)
};

/// What came back.
struct s3_http_response {
  long status = 0;
  std::map<std::string, std::string> headers;  ///< lower-case names
  std::string text;                            ///< body of non-data responses and errors
  std::uint64_t received = 0;                  ///< data bytes delivered to `out`
  bool overflow = false;                       ///< more data bytes than `out` holds
  bool bogus_range = false;  ///< a 206 whose Content-Range lies past the object's end (no body)
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  std::string authorization;  ///< the Authorization header the request carried (for redaction)
  std::string signature;      ///< its signature
};

/// Time limits of one exchange.
struct s3_http_limits {
  long connect_timeout_ms = 5000;  ///< TCP connect
  long timeout_ms = 300000;        ///< the whole exchange
  long stall_seconds = 20;         ///< abandoned when no byte moves for this long
};

/// The libcurl side of one exchange: callbacks that parse headers, deliver data into the
/// request's `out`, keep error bodies as text, and feed the request body (rewindable for retries
/// within libcurl).
struct s3_curl_transfer {
  const s3_http_request* req;
  s3_http_response* resp;
  CURL* h;
  std::size_t sent = 0;
  bool decided = false, data = false;

  static std::size_t on_header(char* p, std::size_t size, std::size_t n, void* ud) {
    auto* t = static_cast<s3_curl_transfer*>(ud);
    std::string_view line(p, size * n);
    if (line.starts_with("HTTP/")) {
      t->resp->headers.clear();
    } else if (line == "\r\n" || line == "\n") {
      // End of headers. A 206 whose Content-Range ends at or past the object's size cannot be
      // honest (s3rver answers "bytes 0-0/0" for an empty object and then sends nothing): stop
      // here instead of waiting for bytes that never come.
      auto it = t->resp->headers.find("content-range");
      if (it != t->resp->headers.end()) {
        unsigned long long a = 0, b = 0, total = 0;
        if (std::sscanf(it->second.c_str(), "bytes %llu-%llu/%llu", &a, &b, &total) == 3 &&
            b >= total) {
          t->resp->bogus_range = true;
          return 0;
        }
      }
    } else if (auto colon = line.find(':'); colon != std::string_view::npos) {
      std::string k(line.substr(0, colon));
      std::transform(k.begin(), k.end(), k.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' '))
        v.remove_suffix(1);
      t->resp->headers[k] = std::string(v);
    }
    return size * n;
  }

  static std::size_t on_data(char* p, std::size_t size, std::size_t n, void* ud) {
    auto* t = static_cast<s3_curl_transfer*>(ud);
    const std::size_t len = size * n;
    if (!t->decided) {
      long status = 0;
      ::curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
      t->data = (status == 200 || status == 206) && !t->req->out.empty();
      t->decided = true;
    }
    if (!t->data) {
      if (t->resp->text.size() < (1u << 20)) t->resp->text.append(p, len);
      return len;
    }
    const std::uint64_t have = t->resp->received;
    const std::uint64_t room = t->req->out.size() > have ? t->req->out.size() - have : 0;
    std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(room, len));
    if (take > 0) std::memcpy(t->req->out.data() + have, p, take);
    t->resp->received += take;
    if (take < len) t->resp->overflow = true;
    return len;
  }

  static std::size_t on_read(char* p, std::size_t size, std::size_t n, void* ud) {
    auto* t = static_cast<s3_curl_transfer*>(ud);
    std::size_t take = std::min(size * n, t->req->body.size() - t->sent);
    if (take > 0) std::memcpy(p, t->req->body.data() + t->sent, take);
    t->sent += take;
    return take;
  }

  static int on_seek(void* ud, curl_off_t offset, int origin) {
    auto* t = static_cast<s3_curl_transfer*>(ud);
    if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t->req->body.size())
      return CURL_SEEKFUNC_FAIL;
    t->sent = static_cast<std::size_t>(offset);
    return CURL_SEEKFUNC_OK;
  }
};

/// Sets what every exchange on `h` needs: only HTTP(S), also after a redirect (none is
/// followed), so that an endpoint or a Location header never makes libcurl read or write files
/// or speak another protocol; no signals; the time limits.
inline void s3_curl_common_options(CURL* h, const s3_http_limits& lim) {
#if LIBCURL_VERSION_NUM >= 0x075500
  ::curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  ::curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  ::curl_easy_setopt(h, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  ::curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS,
                     static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  ::curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  ::curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  ::curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  ::curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, lim.connect_timeout_ms);
  ::curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, lim.timeout_ms);
  ::curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  ::curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, lim.stall_seconds);
}

/// Sets the method of `t`'s request on `h`: HEAD without a body, PUT and POST uploading the
/// request body, other methods (DELETE) as a custom request.
inline void s3_curl_method_options(CURL* h, s3_curl_transfer& t) {
  const s3_http_request& r = *t.req;
  if (r.method == "HEAD") {
    ::curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    ::curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    ::curl_easy_setopt(h, CURLOPT_READFUNCTION, &s3_curl_transfer::on_read);
    ::curl_easy_setopt(h, CURLOPT_READDATA, &t);
    ::curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &s3_curl_transfer::on_seek);
    ::curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    ::curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    if (r.method == "POST") ::curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    ::curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
}

/// Sends `r` to `url` with the header lines `headers` ("Name: value") on the handle `h` (reset
/// first) and fills `resp`: status, headers, data into `r.out` or the body as text, or the curl
/// error. `resp.authorization` and `resp.signature` are left as the caller set them.
inline void s3_http_exchange(CURL* h,
                             const s3_http_request& r,
                             const std::string& url,
                             const std::vector<std::string>& headers,
                             const s3_http_limits& lim,
                             s3_http_response& resp) {
  ::curl_easy_reset(h);
  s3_curl_transfer t{&r, &resp, h};
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* hl = nullptr;
  for (const std::string& line : headers) hl = ::curl_slist_append(hl, line.c_str());
  ::curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  s3_curl_common_options(h, lim);
  ::curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  ::curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  ::curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &s3_curl_transfer::on_header);
  ::curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  ::curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &s3_curl_transfer::on_data);
  ::curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  s3_curl_method_options(h, t);
  resp.curl = ::curl_easy_perform(h);
  if (resp.bogus_range) resp.curl = CURLE_OK;  // an answer: the range is past the end
  if (resp.curl != CURLE_OK) resp.curl_error = errbuf;
  ::curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
  ::curl_slist_free_all(hl);
}

}  // namespace cairn::detail
