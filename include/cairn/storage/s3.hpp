// cairn/storage/s3.hpp: s3_storage, a backend for S3-compatible object stores (AWS S3, MinIO,
// R2, GCS's S3 API, s3rver) over libcurl with SigV4 signing written in cairn (OpenSSL). Part of
// the optional target cairn::s3.
#pragma once

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/detail/names.hpp"
#include "cairn/storage/detail/sigv4.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Options of s3_storage. Empty strings mean "from the environment" (see each field).
struct s3_options {
  /// "http(s)://host[:port]"; empty: AWS_ENDPOINT_URL, else AWS (virtual-hosted addressing).
  /// Any other scheme, a path or user info is refused (errc::invalid_argument).
  std::string endpoint;
  /// Empty: AWS_REGION, else AWS_DEFAULT_REGION, else "us-east-1".
  std::string region;
  /// Empty: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN.
  std::string access_key, secret_key, session_token;
  /// Path-style addressing (http://endpoint/bucket/key). Default: whenever an endpoint is set.
  std::optional<bool> path_style;
  /// Multipart part size of object writers. S3 requires at least 5 MiB (except the last part);
  /// an object whose writer never fills a whole part is uploaded with one PUT.
  std::size_t part_size = std::size_t{16} << 20;
  /// Most requests in flight at once from this storage (all threads together).
  int max_concurrent_requests = 16;
  /// Bound on the total time of one operation, retries included; also each attempt's timeout.
  std::chrono::milliseconds deadline{std::chrono::minutes(5)};
  /// Most attempts per operation (retries on 5xx, SlowDown, RequestTimeout, connection errors).
  int max_attempts = 12;
  /// First retry delay; doubled each retry up to backoff_max, with "equal jitter".
  std::chrono::milliseconds backoff_initial{100}, backoff_max{std::chrono::seconds(5)};
  /// TCP connect timeout of one attempt.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  /// An attempt that moves no byte for this long is abandoned (stalled uploads) and retried.
  std::chrono::seconds stall_timeout{20};
  /// Throttled uploads: at most this many bytes per second from this storage (0: unlimited).
  std::uint64_t upload_bytes_per_second = 0;
  /// Throttled uploads: when set, every upload request holds an exclusive flock on this file,
  /// so processes (ranks) sharing it — e.g. one path per node — upload one at a time.
  std::string upload_lock_file;
  /// Pre-download: when set, the first read of an object downloads it whole into this local
  /// directory and every read is served from there. Objects are assumed not to change behind
  /// this storage's back while it lives (put and remove through it invalidate).
  std::string cache_dir;
  /// The rank recorded in errors this storage reports (-1: unknown).
  int rank = -1;
  /// Called before every attempt of every request with (method, object key, query): logging
  /// and fault-injection hook for tests.
  std::function<void(std::string_view, std::string_view, std::string_view)> on_request;
  /// Page size of ListObjectsV2 requests (S3's maximum is 1000).
  int list_page_size = 1000;
};

/// What an s3_storage did so far (a snapshot of its counters).
struct s3_counters {
  std::uint64_t requests = 0;             ///< attempts sent, retries included
  std::uint64_t retries = 0;              ///< attempts that were retries
  std::uint64_t gets = 0;                 ///< successful GETs of object data
  std::uint64_t bytes_got = 0;            ///< object bytes received by successful GETs
  std::uint64_t puts = 0;                 ///< successful single PUTs (put, small writers)
  std::uint64_t parts = 0;                ///< successful UploadPart requests
  std::uint64_t bytes_put = 0;            ///< object bytes sent by successful PUTs and parts
  std::uint64_t multipart_completed = 0;  ///< multipart uploads completed
  std::uint64_t multipart_aborted = 0;    ///< multipart uploads aborted (or abandoned)
  std::uint64_t heads = 0;                ///< HEAD requests answered
  std::uint64_t lists = 0;                ///< ListObjectsV2 pages received
  std::uint64_t deletes = 0;              ///< objects deleted
};

namespace detail {

/// Parses "s3://bucket[/prefix]" into bucket and prefix (no leading or trailing '/').
inline result<std::pair<std::string, std::string>> parse_s3_uri(std::string_view uri) {
  constexpr std::string_view scheme = "s3://";
  if (!uri.starts_with(scheme))
    return make_error(errc::invalid_argument, "not an s3:// URI: \"" + std::string(uri) +
                                                  "\" (expected s3://bucket/prefix)");
  std::string_view rest = uri.substr(scheme.size());
  std::size_t slash = rest.find('/');
  std::string bucket(rest.substr(0, slash));
  std::string prefix(slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1));
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (bucket.empty())
    return make_error(errc::invalid_argument, "no bucket in \"" + std::string(uri) + "\"");
  // The bucket becomes part of the host name (virtual-hosted addressing) and of the URL path:
  // '@', ':', '#', '?' or '%' in it could point requests at another host.
  for (char c : bucket) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok)
      return make_error(errc::invalid_argument,
                        "bad bucket name in \"" + std::string(uri) +
                            "\" (S3 bucket names hold letters, digits, '.', '-' and '_')");
  }
  if (!prefix.empty() && !name_problem(prefix).empty())
    return make_error(errc::invalid_argument,
                      "bad prefix in \"" + std::string(uri) + "\": " + name_problem(prefix));
  return std::pair{bucket, prefix};
}

/// An S3 endpoint split into its scheme ("http" or "https") and "host[:port]".
struct s3_endpoint {
  std::string scheme, hostport;
};

/// Parses an endpoint "http(s)://host[:port][/]" (no scheme: https). Any other scheme
/// (`file://`, `ftp://`, ...), user info, a path, a query or characters that do not belong in a
/// host name are errc::invalid_argument: libcurl would otherwise follow them (a `file://`
/// endpoint writes local files).
inline result<s3_endpoint> parse_s3_endpoint(std::string_view endpoint) {
  auto bad = [&](const std::string& why) -> error {
    // User info ("user:password@") is not repeated in the error.
    std::string shown(endpoint);
    if (std::size_t at = shown.rfind('@'); at != std::string::npos) {
      std::size_t sep = shown.find("://");
      std::size_t from = sep == std::string::npos || sep > at ? 0 : sep + 3;
      shown.replace(from, at + 1 - from, "[user info]@");
    }
    return make_error(errc::invalid_argument, "bad S3 endpoint \"" + shown + "\": " + why);
  };
  s3_endpoint out{"https", ""};
  std::string_view rest = endpoint;
  if (std::size_t sep = rest.find("://"); sep != std::string_view::npos) {
    out.scheme = std::string(rest.substr(0, sep));
    std::transform(out.scheme.begin(), out.scheme.end(), out.scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (out.scheme != "http" && out.scheme != "https")
      return bad("the scheme \"" + std::string(rest.substr(0, sep)) +
                 "\" is not allowed (only http:// and https://)");
    rest.remove_prefix(sep + 3);
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.empty()) return bad("no host");
  for (char c : rest) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']';
    if (c == '@') return bad("user info is not allowed (credentials come from s3_options)");
    if (!ok)
      return bad(static_cast<unsigned char>(c) < 0x20 || c == 0x7f
                     ? "a control character (expected http(s)://host[:port])"
                     : "the character '" + std::string(1, c) +
                           "' (expected http(s)://host[:port], no path or query)");
  }
  out.hostport = std::string(rest);
  return out;
}

/// Longest text a server (or libcurl) contributes to one error message, in bytes.
inline constexpr std::size_t max_server_text = 300;

/// Replaces every occurrence of credential material in `text` with "[redacted]":
/// - each of `secrets` (secret key, session token, signature), also percent-encoded, and any
///   piece of one at least 16 characters long (a truncated echo);
/// - `authorization` (the Authorization header value sent), whole;
/// - the value after "Signature=", "X-Amz-Signature", "X-Amz-Credential=",
///   "x-amz-security-token", "Authorization" (those two followed by ':' or '=') and
///   "AWS4-HMAC-SHA256 Credential=", in any case;
/// - every run of exactly 64 hex digits (the form of SigV4 signatures).
inline std::string redact_credentials(std::string text,
                                      std::span<const std::string> secrets,
                                      std::string_view authorization = {}) {
  static constexpr std::string_view mark = "[redacted]";
  auto lower = [](std::string_view v) {
    std::string l(v);
    std::transform(l.begin(), l.end(), l.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return l;
  };
  auto replace_all = [&](std::string_view what) {
    if (what.empty()) return;
    for (std::size_t at = text.find(what); at != std::string::npos;
         at = text.find(what, at + mark.size()))
      text.replace(at, what.size(), mark);
  };
  replace_all(authorization);
  constexpr std::size_t min_piece = 16;
  for (const std::string& s : secrets) {
    if (s.empty()) continue;
    replace_all(s);
    replace_all(sigv4::uri_encode(s, false));
    if (s.size() < min_piece) continue;
    // Pieces: find any 16-character window of the secret, then grow the match both ways.
    for (std::size_t w = 0; w + min_piece <= s.size(); ++w) {
      std::string_view piece = std::string_view(s).substr(w, min_piece);
      for (std::size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at)) {
        std::size_t b = at, e = at + min_piece, sb = w, se = w + min_piece;
        while (b > 0 && sb > 0 && text[b - 1] == s[sb - 1]) --b, --sb;
        while (e < text.size() && se < s.size() && text[e] == s[se]) ++e, ++se;
        text.replace(b, e - b, mark);
        at = b + mark.size();
      }
    }
  }
  // Named values: from after the name (and, where the name does not end in '=', a ':' or '='
  // between quotes and spaces) to the end of the value.
  struct named {
    std::string_view name;
    bool needs_separator;  // "name: value", "name=value", "\"name\": \"value\""
    bool stops_at_space;   // the value is one token (else it runs to the end of the line)
  };
  auto is_end = [](char c, bool stops_at_space) {
    return c == '\r' || c == '\n' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '&' ||
           c == '}' || (stops_at_space && (c == ' ' || c == '\t' || c == ',' || c == ';'));
  };
  auto is_gap = [](char c) { return c == '"' || c == '\'' || c == ' ' || c == '\t'; };
  for (const named& n :
       {named{"signature=", false, true}, named{"x-amz-credential=", false, true},
        named{"x-amz-signature", true, true}, named{"x-amz-security-token", true, false},
        named{"authorization", true, false}, named{"aws4-hmac-sha256 credential=", false, false}}) {
    std::string l = lower(text);
    for (std::size_t at = l.find(n.name); at != std::string::npos; at = l.find(n.name, at + 1)) {
      std::size_t b = at + n.name.size();
      if (n.needs_separator) {
        while (b < l.size() && b - at - n.name.size() < 4 && is_gap(l[b])) ++b;
        if (b >= l.size() || (l[b] != ':' && l[b] != '=')) continue;
        ++b;
      }
      for (int gap = 0; b < l.size() && gap < 4 && is_gap(l[b]); ++gap) ++b;
      std::size_t e = b;
      while (e < l.size() && !is_end(l[e], n.stops_at_space)) ++e;
      if (e > b && l.compare(b, e - b, mark) != 0) {
        text.replace(b, e - b, mark);
        l.replace(b, e - b, mark);
      }
    }
  }
  auto hexdigit = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  };
  for (std::size_t i = 0; i < text.size();) {
    if (!hexdigit(text[i])) {
      ++i;
      continue;
    }
    std::size_t e = i;
    while (e < text.size() && hexdigit(text[e])) ++e;
    if (e - i == 64) {
      text.replace(i, 64, mark);
      i += mark.size();
    } else {
      i = e;
    }
  }
  return text;
}

/// Text from a server or libcurl made fit for an error message: at most 4 KiB looked at,
/// credential material redacted (redact_credentials), control characters turned into spaces,
/// and at most max_server_text bytes kept (cut on a UTF-8 boundary, "..." appended).
inline std::string safe_server_text(std::string_view raw,
                                    std::span<const std::string> secrets,
                                    std::string_view authorization = {}) {
  std::string text = redact_credentials(std::string(raw.substr(0, 4096)), secrets, authorization);
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  if (text.size() > max_server_text || raw.size() > 4096) {
    std::size_t cut = std::min(text.size(), max_server_text);
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

/// An S3 error code (`<Code>`) as sent when it looks like one (letters, digits, '.', '_', '-',
/// at most 64 characters); empty otherwise, so that a hostile server cannot put text there.
inline std::string s3_error_code_of(std::string_view code) {
  if (code.empty() || code.size() > 64) return {};
  for (char c : code) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) return {};
  }
  return std::string(code);
}

/// The text of the first <tag>...</tag> in `xml`, entities decoded; empty when absent.
inline std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (ent.starts_with('#')) {
      unsigned long cp = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X')
                             ? std::strtoul(std::string(ent.substr(2)).c_str(), nullptr, 16)
                             : std::strtoul(std::string(ent.substr(1)).c_str(), nullptr, 10);
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

/// The decoded texts of every <tag>...</tag> in `xml`, in order.
inline std::vector<std::string> xml_all(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  std::size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    pos += open.size();
    std::size_t end = xml.find(close, pos);
    if (end == std::string_view::npos) break;
    out.push_back(xml_unescape(xml.substr(pos, end - pos)));
    pos = end + close.size();
  }
  return out;
}

/// The decoded text of the first <tag>...</tag> in `xml`; empty when absent.
inline std::string xml_first(std::string_view xml, std::string_view tag) {
  auto all = xml_all(xml, tag);
  return all.empty() ? std::string() : all.front();
}

/// Escapes text for an XML element.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
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
  int out_fd = -1;           ///< GET: stream the object into this file instead
  bool upload = false;       ///< counts as an upload (throttling, lock file)
};

/// What came back.
struct s3_http_response {
  long status = 0;
  std::map<std::string, std::string> headers;  ///< lower-case names
  std::string text;                            ///< body of non-data responses and errors
  std::uint64_t received = 0;                  ///< data bytes delivered to out/out_fd
  bool overflow = false;                       ///< more data bytes than `out` holds
  bool bogus_range = false;  ///< a 206 whose Content-Range lies past the object's end (no body)
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  std::string authorization;  ///< the Authorization header the request carried (for redaction)
  std::string signature;      ///< its signature
};

/// Shared state of an s3_storage: configuration, handle pool, request bound, counters. Writers
/// keep it alive.
class s3_client {
 public:
  s3_client(std::string bucket, std::string prefix, s3_options opt)
      : bucket_(std::move(bucket)), prefix_(std::move(prefix)), opt_(std::move(opt)) {
    static const bool curl_ready = [] { return ::curl_global_init(CURL_GLOBAL_DEFAULT) == 0; }();
    (void)curl_ready;
    auto env = [](const char* n) -> std::string {
      const char* v = std::getenv(n);
      return v ? v : "";
    };
    if (opt_.endpoint.empty()) opt_.endpoint = env("AWS_ENDPOINT_URL");
    if (opt_.region.empty()) opt_.region = env("AWS_REGION");
    if (opt_.region.empty()) opt_.region = env("AWS_DEFAULT_REGION");
    if (opt_.region.empty()) opt_.region = "us-east-1";
    if (opt_.access_key.empty()) opt_.access_key = env("AWS_ACCESS_KEY_ID");
    if (opt_.secret_key.empty()) opt_.secret_key = env("AWS_SECRET_ACCESS_KEY");
    if (opt_.session_token.empty()) opt_.session_token = env("AWS_SESSION_TOKEN");
    const bool custom = !opt_.endpoint.empty();
    path_style_ = opt_.path_style.value_or(custom);
    for (char c : opt_.region) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_')
        throw exception(make_error(
            errc::invalid_argument,
            "bad S3 region \"" + opt_.region + "\" (letters, digits, '-' and '_' only)"));
    }
    s3_endpoint ep{"https", "s3." + opt_.region + ".amazonaws.com"};
    if (custom) {
      auto parsed = parse_s3_endpoint(opt_.endpoint);
      if (!parsed) throw exception(parsed.err());
      ep = *parsed;
    }
    endpoint_ = ep.scheme + "://" + ep.hostport;
    host_ = path_style_ ? ep.hostport : bucket_ + "." + ep.hostport;
    base_url_ = ep.scheme + "://" + host_;
    if (opt_.part_size == 0) opt_.part_size = std::size_t{16} << 20;
    if (opt_.max_concurrent_requests < 1) opt_.max_concurrent_requests = 1;
    if (opt_.max_attempts < 1) opt_.max_attempts = 1;
    cred_ = {opt_.access_key, opt_.secret_key, opt_.session_token};
  }
  s3_client(const s3_client&) = delete;
  s3_client& operator=(const s3_client&) = delete;
  ~s3_client() {
    for (CURL* h : pool_) ::curl_easy_cleanup(h);
  }

  const s3_options& options() const { return opt_; }
  const std::string& bucket() const { return bucket_; }
  /// "scheme://host[:port]" of the server (without the bucket).
  const std::string& endpoint() const { return endpoint_; }

  /// The object key of a storage name.
  std::string key_of(std::string_view name) const {
    return prefix_.empty() ? std::string(name) : prefix_ + "/" + std::string(name);
  }
  /// The key prefix every name gets ("" or "prefix/").
  std::string key_prefix() const { return prefix_.empty() ? std::string() : prefix_ + "/"; }
  /// "s3://bucket/prefix/name".
  std::string describe(std::string_view name) const {
    return "s3://" + bucket_ + "/" + key_of(name);
  }

  /// The canonical (encoded) path of a key.
  std::string path_of(std::string_view key) const {
    std::string p = path_style_ ? "/" + sigv4::uri_encode(bucket_, false) : std::string();
    p += "/" + sigv4::uri_encode(key, true);
    return p;
  }

  /// Signs a request at `amz_date` (exposed for the signature tests).
  sigv4::signed_headers sign(const s3_http_request& r, const std::string& amz_date) const {
    sigv4::request sr;
    sr.method = r.method;
    sr.host = host_;
    sr.path = path_of(r.key);
    sr.query = r.query;
    sr.headers = r.headers;
    sr.payload_sha256 = r.body_sha256.empty() ? sigv4::payload_hash(r.body) : r.body_sha256;
    return sigv4::sign(sr, cred_, opt_.region, amz_date);
  }

  /// Sends `r` with retries (5xx, SlowDown, RequestTimeout, connection errors) until it gets an
  /// answer that is not retryable, the attempts run out or the deadline passes. Returns the last
  /// answer; `what` and `name` make the error of a failure to get one.
  result<s3_http_response> perform(s3_http_request& r,
                                   std::string_view what,
                                   std::string_view name,
                                   int max_attempts = 0) {
    if (r.body_sha256.empty()) r.body_sha256 = sigv4::payload_hash(r.body);
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + opt_.deadline;
    int attempts_allowed = max_attempts > 0 ? max_attempts : opt_.max_attempts;
    // After an operation gave up on an unreachable server, later ones try once until it answers.
    if (clock::now().time_since_epoch().count() < unreachable_until_.load()) attempts_allowed = 1;
    s3_http_response resp;
    std::string last;
    int attempt = 0;
    for (;; ++attempt) {
      if (attempt > 0) ++retries_;
      resp = attempt_once(r, deadline);
      bool retry = false;
      if (resp.curl != CURLE_OK) {
        last = std::string("curl: ") + ::curl_easy_strerror(resp.curl) +
               (resp.curl_error.empty() ? "" : " (" + server_text(resp.curl_error, resp) + ")");
        retry = resp.curl != CURLE_URL_MALFORMAT && resp.curl != CURLE_UNSUPPORTED_PROTOCOL &&
                resp.curl != CURLE_OUT_OF_MEMORY;
      } else {
        std::string code = sigv4_error_code(resp);
        last = "last HTTP status " + std::to_string(resp.status) + status_text(resp, code);
        retry = resp.status >= 500 || code == "SlowDown" || code == "RequestTimeout" ||
                code == "InternalError" || resp.status == 429 ||
                // CompleteMultipartUpload may fail with 200 and an <Error> body.
                (resp.status == 200 && resp.text.find("<Error>") != std::string::npos);
        if (!retry) {
          unreachable_until_.store(0);
          return resp;
        }
      }
      auto now = clock::now();
      auto cap = std::min<std::int64_t>(opt_.backoff_max.count(), opt_.backoff_initial.count()
                                                                      << std::min(attempt, 20));
      std::int64_t delay_ms;
      {
        std::lock_guard lock(rng_mu_);
        delay_ms =
            cap / 2 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(cap / 2 + 1));
      }
      if (attempt + 1 >= attempts_allowed ||
          now + std::chrono::milliseconds(delay_ms) >= deadline) {
        if (resp.curl != CURLE_OK)
          unreachable_until_.store((clock::now() + opt_.deadline).time_since_epoch().count());
        double secs = std::chrono::duration<double>(clock::now() - start).count();
        char took[32];
        std::snprintf(took, sizeof took, "%.1f", secs);
        error e = make_error(
            errc::io, redact("S3 " + std::string(what) + " of key \"" + r.key + "\" in bucket \"" +
                             bucket_ + "\" gave up after " + std::to_string(attempt + 1) +
                             " attempt(s) in " + took + " s: " + last));
        e.file = describe(name);
        e.rank = opt_.rank;
        return e;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    }
  }

  /// An error for an answer that is not a success. A 404 saying NoSuchBucket, or a 404
  /// without an error code (HEAD) while the bucket itself answers 404, is bucket_missing().
  error http_error(const s3_http_response& resp,
                   std::string_view what,
                   const std::string& key,
                   std::string_view name) {
    std::string code = sigv4_error_code(resp);
    const std::string request = "S3 " + std::string(what) + " of key \"" + key + "\"";
    if (resp.status == 404 && code == "NoSuchBucket")
      return bucket_missing(name, request + " answered 404 NoSuchBucket");
    if (resp.status == 404 && code.empty()) {
      auto there = check_bucket(name);
      if (!there) return there.err();
    }
    error e = make_error(resp.status == 404 ? errc::not_found : errc::io,
                         redact(request + " in bucket \"" + bucket_ + "\" failed: HTTP status " +
                                std::to_string(resp.status) + status_text(resp, code)));
    e.file = describe(name);
    e.rank = opt_.rank;
    return e;
  }

  /// Resolves the 404 of a request on object `name` that has no body to say why (HEAD): ok when
  /// the bucket exists (known from an earlier check, or HEAD of the bucket says so, or cannot
  /// tell), bucket_missing() when the bucket answers 404. Remembers that the bucket exists.
  result<void> check_bucket(std::string_view name) {
    if (bucket_exists_.load()) return ok();
    s3_http_request r;
    r.method = "HEAD";
    CAIRN_TRY_ASSIGN(auto resp, perform(r, "HeadBucket", name));
    if (resp.status == 404)
      return bucket_missing(
          name, "S3 HEAD of key \"" + key_of(name) + "\" and of the bucket answered 404");
    // 403 (no s3:ListBucket) and redirects (another region) also say the bucket is there.
    if ((resp.status >= 200 && resp.status < 400) || resp.status == 403) bucket_exists_.store(true);
    return ok();
  }

  /// errc::not_found "bucket 'b' does not exist at http://host:port (`why`)".
  error bucket_missing(std::string_view name, const std::string& why) const {
    error e = make_error(errc::not_found, "bucket '" + bucket_ + "' does not exist at " +
                                              endpoint_ + " (" + redact(why) + ")");
    e.file = describe(name);
    e.rank = opt_.rank;
    return e;
  }

  /// A snapshot of the counters.
  s3_counters counters() const {
    s3_counters c;
    c.requests = requests_;
    c.retries = retries_;
    c.gets = gets_;
    c.bytes_got = bytes_got_;
    c.puts = puts_;
    c.parts = parts_;
    c.bytes_put = bytes_put_;
    c.multipart_completed = mp_completed_;
    c.multipart_aborted = mp_aborted_;
    c.heads = heads_;
    c.lists = lists_;
    c.deletes = deletes_;
    return c;
  }

  // Counters the storage and writers bump.
  std::atomic<std::uint64_t> requests_{0}, retries_{0}, gets_{0}, bytes_got_{0}, puts_{0},
      parts_{0}, bytes_put_{0}, mp_completed_{0}, mp_aborted_{0}, heads_{0}, lists_{0}, deletes_{0};

 private:
  /// The S3 error code of an answer (<Code>), empty when absent or not shaped like one.
  static std::string sigv4_error_code(const s3_http_response& resp) {
    if (resp.text.empty()) return {};
    return s3_error_code_of(detail::xml_first(resp.text, "Code"));
  }

  /// `text` with every occurrence of the secret key and the session token replaced.
  std::string redact(std::string text) const {
    for (const std::string& secret : {cred_.secret_key, cred_.session_token}) {
      if (secret.empty()) continue;
      for (std::size_t at = text.find(secret); at != std::string::npos;
           at = text.find(secret, at + 10))
        text.replace(at, secret.size(), "[redacted]");
    }
    return text;
  }

  /// Text from the server or libcurl, fit for an error message (see safe_server_text): the
  /// secret key, the session token, and the signature and Authorization header that `resp`'s
  /// request carried are redacted.
  std::string server_text(std::string_view raw, const s3_http_response& resp) const {
    const std::string secrets[] = {cred_.secret_key, cred_.session_token, resp.signature};
    return safe_server_text(raw, secrets, resp.authorization);
  }

  /// " Code: message" of an error answer (only <Code> and <Message> of its body are read, made
  /// safe), or "".
  std::string status_text(const s3_http_response& resp, const std::string& code) const {
    std::string msg =
        resp.text.empty() ? std::string() : server_text(xml_first(resp.text, "Message"), resp);
    return (code.empty() ? "" : " " + code) + (msg.empty() ? "" : ": " + msg);
  }

  struct transfer {
    s3_http_request* req;
    s3_http_response* resp;
    std::size_t sent = 0;
    CURL* h;
    bool decided = false, data = false;
  };

  static std::size_t on_header(char* p, std::size_t size, std::size_t n, void* ud) {
    auto* t = static_cast<transfer*>(ud);
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
    auto* t = static_cast<transfer*>(ud);
    const std::size_t len = size * n;
    if (!t->decided) {
      long status = 0;
      ::curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
      t->data = (status == 200 || status == 206) && (!t->req->out.empty() || t->req->out_fd >= 0);
      t->decided = true;
    }
    if (!t->data) {
      if (t->resp->text.size() < (1u << 20)) t->resp->text.append(p, len);
      return len;
    }
    const std::size_t off = 0;
    std::size_t rest = len;
    if (t->req->out_fd >= 0) {
      const char* q = p + off;
      while (rest > 0) {
        ssize_t w = ::write(t->req->out_fd, q, rest);
        if (w < 0) {
          if (errno == EINTR) continue;
          return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
        }
        q += w;
        rest -= static_cast<std::size_t>(w);
        t->resp->received += static_cast<std::uint64_t>(w);
      }
      return len;
    }
    const std::uint64_t have = t->resp->received;
    const std::uint64_t room = t->req->out.size() > have ? t->req->out.size() - have : 0;
    std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(room, rest));
    if (take > 0) std::memcpy(t->req->out.data() + have, p + off, take);
    t->resp->received += take;
    if (take < rest) t->resp->overflow = true;
    return len;
  }

  static std::size_t on_read(char* p, std::size_t size, std::size_t n, void* ud) {
    auto* t = static_cast<transfer*>(ud);
    std::size_t take = std::min(size * n, t->req->body.size() - t->sent);
    if (take > 0) std::memcpy(p, t->req->body.data() + t->sent, take);
    t->sent += take;
    return take;
  }

  static int on_seek(void* ud, curl_off_t offset, int origin) {
    auto* t = static_cast<transfer*>(ud);
    if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t->req->body.size())
      return CURL_SEEKFUNC_FAIL;
    t->sent = static_cast<std::size_t>(offset);
    return CURL_SEEKFUNC_OK;
  }

  CURL* acquire() {
    std::unique_lock lock(mu_);
    slots_cv_.wait(lock, [&] { return in_flight_ < opt_.max_concurrent_requests; });
    ++in_flight_;
    if (!pool_.empty()) {
      CURL* h = pool_.back();
      pool_.pop_back();
      return h;
    }
    lock.unlock();
    return ::curl_easy_init();
  }
  void release(CURL* h) {
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      if (h) pool_.push_back(h);
    }
    slots_cv_.notify_one();
  }

  // Upload pacing: reserves n bytes of the rate and sleeps until they may go.
  void pace_upload(std::size_t n) {
    if (opt_.upload_bytes_per_second == 0 || n == 0) return;
    using clock = std::chrono::steady_clock;
    clock::time_point at;
    {
      std::lock_guard lock(rng_mu_);
      auto now = clock::now();
      if (next_upload_ < now) next_upload_ = now;
      at = next_upload_;
      next_upload_ += std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
          static_cast<double>(n) / static_cast<double>(opt_.upload_bytes_per_second)));
    }
    std::this_thread::sleep_until(at);
  }

  s3_http_response attempt_once(s3_http_request& r,
                                std::chrono::steady_clock::time_point deadline) {
    s3_http_response resp;
    ++requests_;
    std::string query = sigv4::canonical_query(r.query);
    if (opt_.on_request) opt_.on_request(r.method, r.key, query);
    int lock_fd = -1;
    if (r.upload) {
      pace_upload(r.body.size());
      if (!opt_.upload_lock_file.empty()) {
        lock_fd = ::open(opt_.upload_lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock_fd >= 0) {
          while (::flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {
          }
        }
      }
    }
    CURL* h = acquire();
    if (!h) {
      release(nullptr);
      if (lock_fd >= 0) ::close(lock_fd);
      resp.curl = CURLE_OUT_OF_MEMORY;
      return resp;
    }
    ::curl_easy_reset(h);
    transfer t{&r, &resp, 0, h};
    char errbuf[CURL_ERROR_SIZE] = {};
    const std::string url = base_url_ + path_of(r.key) + (query.empty() ? "" : "?" + query);
    auto sig = sign(r, sigv4::amz_date(std::time(nullptr)));
    resp.authorization = sig.authorization;
    resp.signature = sig.signature;
    curl_slist* hl = nullptr;
    auto add = [&](const std::string& s) { hl = ::curl_slist_append(hl, s.c_str()); };
    add("Host: " + host_);
    add("x-amz-date: " + sig.amz_date);
    add("x-amz-content-sha256: " + r.body_sha256);
    if (!cred_.session_token.empty()) add("x-amz-security-token: " + cred_.session_token);
    for (const auto& [k, v] : r.headers) add(k + ": " + v);
    add("Authorization: " + sig.authorization);
    add("Expect:");
    if (r.method != "PUT" && r.method != "POST") add("Transfer-Encoding:");
    ::curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    // Only HTTP(S), also after a redirect (none is followed): an endpoint or a Location header
    // must never make libcurl read or write files or speak another protocol.
#if LIBCURL_VERSION_NUM >= 0x075500
    ::curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    ::curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    ::curl_easy_setopt(h, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    ::curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS,
                       static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    ::curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    ::curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    ::curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    ::curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    ::curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
    ::curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    ::curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_data);
    ::curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    ::curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    ::curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                       static_cast<long>(opt_.connect_timeout.count()));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    ::curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(std::max<std::int64_t>(left.count(), 200)));
    ::curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    ::curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(opt_.stall_timeout.count()));
    if (r.method == "HEAD") {
      ::curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (r.method == "PUT" || r.method == "POST") {
      ::curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      ::curl_easy_setopt(h, CURLOPT_READFUNCTION, &on_read);
      ::curl_easy_setopt(h, CURLOPT_READDATA, &t);
      ::curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &on_seek);
      ::curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
      ::curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
      if (r.method == "POST") ::curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
    } else if (r.method != "GET") {
      ::curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
    }
    resp.curl = ::curl_easy_perform(h);
    if (resp.bogus_range) resp.curl = CURLE_OK;  // an answer: the range is past the end
    if (resp.curl != CURLE_OK) resp.curl_error = errbuf;
    ::curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
    ::curl_slist_free_all(hl);
    release(h);
    if (lock_fd >= 0) ::close(lock_fd);
    return resp;
  }

  std::string bucket_, prefix_;
  s3_options opt_;
  bool path_style_ = true;
  std::string host_, base_url_, endpoint_;
  sigv4::credentials cred_;
  std::atomic<bool> bucket_exists_{false};
  std::mutex mu_;
  std::condition_variable slots_cv_;
  int in_flight_ = 0;
  std::vector<CURL*> pool_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_{std::random_device{}()};
  std::chrono::steady_clock::time_point next_upload_{};
  std::atomic<std::int64_t> unreachable_until_{0};
};

/// The writer of s3_storage: buffers whole parts, uploads each part as soon as it is complete
/// (from the writing thread, so parts go up in parallel), and on finish() completes the
/// multipart upload — or sends one PUT when no part was ever complete. Until then nothing is
/// visible under the name. A writer that is dropped or fails aborts its multipart upload.
class s3_writer final : public object_writer {
 public:
  s3_writer(std::shared_ptr<s3_client> c, std::string name)
      : c_(std::move(c)),
        name_(std::move(name)),
        key_(c_->key_of(name_)),
        part_size_(c_->options().part_size) {}
  s3_writer(const s3_writer&) = delete;
  s3_writer& operator=(const s3_writer&) = delete;
  ~s3_writer() override {
    std::lock_guard lock(mu_);
    if (!finished_ && !upload_id_.empty()) abort_locked();
  }

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    {
      std::lock_guard lock(mu_);
      if (finished_) return usage("write_at after finish()");
      if (failed_) return *failed_;
      if (data.size() > UINT64_MAX - offset) return usage("write range overflows");
      end_ = std::max(end_, offset + data.size());
    }
    std::uint64_t pos = offset;
    std::size_t done = 0;
    while (done < data.size()) {
      const std::uint64_t idx = pos / part_size_;
      const std::uint64_t part_begin = idx * part_size_;
      const std::size_t in_part = static_cast<std::size_t>(pos - part_begin);
      const std::size_t len = std::min<std::size_t>(part_size_ - in_part, data.size() - done);
      std::span<const std::byte> chunk = data.subspan(done, len);
      auto r = write_part(idx, in_part, chunk);
      if (!r) {
        std::lock_guard lock(mu_);
        if (!failed_) failed_ = r.err();
        error e = r.err();
        e.offset = pos;
        return e;
      }
      pos += len;
      done += len;
    }
    return ok();
  }

  result<void> finish() override {
    std::unique_lock lock(mu_);
    if (finished_) return usage("finish() called twice");
    finished_ = true;
    if (failed_) {
      if (!upload_id_.empty()) abort_locked();
      return *failed_;
    }
    if (upload_id_.empty()) {
      // No part was ever complete: one PUT of the whole object.
      std::vector<std::byte> whole(static_cast<std::size_t>(end_));
      for (auto& [idx, p] : parts_) {
        if (!p.buf) continue;
        std::uint64_t b = idx * part_size_;
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(part_size_, end_ - b));
        std::memcpy(whole.data() + b, p.buf.get(), n);
      }
      parts_.clear();
      s3_http_request r;
      r.method = "PUT";
      r.key = key_;
      r.body = whole;
      r.upload = true;
      CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "PUT", name_));
      if (resp.status != 200) return c_->http_error(resp, "PUT", key_, name_);
      ++c_->puts_;
      c_->bytes_put_ += whole.size();
      return ok();
    }
    // Upload every part not yet uploaded (partially written ones are zero-filled), then complete.
    const std::uint64_t nparts = (end_ + part_size_ - 1) / part_size_;
    for (std::uint64_t idx = 0; idx < nparts; ++idx) {
      part& p = parts_[idx];
      if (!p.etag.empty()) continue;
      if (!p.buf) p.buf = zeroed(part_size_);
      const std::uint64_t b = idx * part_size_;
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(part_size_, end_ - b));
      auto r = upload_part(idx, {p.buf.get(), n});
      if (!r) {
        abort_locked();
        return r.err();
      }
      p.etag = *r;
      p.buf.reset();
    }
    std::string xml = "<CompleteMultipartUpload>";
    for (std::uint64_t idx = 0; idx < nparts; ++idx) {
      xml += "<Part><PartNumber>" + std::to_string(idx + 1) + "</PartNumber><ETag>" +
             xml_escape(parts_[idx].etag) + "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    s3_http_request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    r.body = std::as_bytes(std::span(xml));
    auto resp = c_->perform(r, "CompleteMultipartUpload", name_);
    if (!resp || resp->status != 200 || resp->text.find("<Error>") != std::string::npos) {
      error e = resp ? c_->http_error(*resp, "CompleteMultipartUpload", key_, name_) : resp.err();
      abort_locked();
      return e;
    }
    ++c_->mp_completed_;
    parts_.clear();
    return ok();
  }

 private:
  struct part {
    std::unique_ptr<std::byte[]> buf;
    std::size_t filled = 0;
    bool uploading = false;
    std::string etag;
  };

  static std::unique_ptr<std::byte[]> zeroed(std::size_t n) {
    return std::unique_ptr<std::byte[]>(new std::byte[n]());
  }

  error usage(const std::string& what) const {
    error e = make_error(errc::invalid_argument, what + " on " + c_->describe(name_));
    e.file = c_->describe(name_);
    return e;
  }

  // Copies a chunk into its part, uploading the part once it is full. A chunk that is a whole
  // part goes up straight from the caller's memory.
  result<void> write_part(std::uint64_t idx,
                          std::size_t in_part,
                          std::span<const std::byte> chunk) {
    std::byte* dst = nullptr;
    bool direct = false;
    {
      std::lock_guard lock(mu_);
      part& p = parts_[idx];
      if (p.uploading || !p.etag.empty())
        return usage("write_at into part " + std::to_string(idx + 1) +
                     " after it was complete (overlapping writes)");
      if (chunk.size() == part_size_ && !p.buf) {
        p.uploading = direct = true;
      } else {
        if (!p.buf) p.buf = zeroed(part_size_);
        dst = p.buf.get();
      }
    }
    std::span<const std::byte> payload = chunk;
    std::unique_ptr<std::byte[]> owned;
    if (!direct) {
      std::memcpy(dst + in_part, chunk.data(), chunk.size());
      std::lock_guard lock(mu_);
      part& p = parts_[idx];
      p.filled += chunk.size();
      if (p.filled < part_size_) return ok();
      p.uploading = true;
      owned = std::move(p.buf);
      payload = {owned.get(), part_size_};
    }
    CAIRN_TRY(ensure_upload());
    auto etag = upload_part(idx, payload);
    std::lock_guard lock(mu_);
    part& p = parts_[idx];
    p.uploading = false;
    if (!etag) return etag.err();
    p.etag = *etag;
    return ok();
  }

  result<void> ensure_upload() {
    std::lock_guard lock(create_mu_);
    {
      std::lock_guard l2(mu_);
      if (!upload_id_.empty()) return ok();
    }
    s3_http_request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploads", ""}};
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "CreateMultipartUpload", name_));
    if (resp.status != 200) return c_->http_error(resp, "CreateMultipartUpload", key_, name_);
    std::string id = xml_first(resp.text, "UploadId");
    if (id.empty()) {
      error e = make_error(errc::io,
                           "S3 CreateMultipartUpload of key \"" + key_ + "\" returned no UploadId");
      e.file = c_->describe(name_);
      return e;
    }
    std::lock_guard l2(mu_);
    upload_id_ = std::move(id);
    return ok();
  }

  result<std::string> upload_part(std::uint64_t idx, std::span<const std::byte> payload) {
    std::string id;
    {
      // upload_id_ is only written once, before any part uploads; reading it under mu_ when the
      // caller does not hold it would deadlock finish(), which holds mu_.
      id = upload_id_;
    }
    s3_http_request r;
    r.method = "PUT";
    r.key = key_;
    r.query = {{"partNumber", std::to_string(idx + 1)}, {"uploadId", id}};
    r.body = payload;
    r.upload = true;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "UploadPart", name_));
    if (resp.status != 200) return c_->http_error(resp, "UploadPart", key_, name_);
    auto it = resp.headers.find("etag");
    if (it == resp.headers.end() || it->second.empty()) {
      error e = make_error(errc::io, "S3 UploadPart of key \"" + key_ + "\" returned no ETag");
      e.file = c_->describe(name_);
      return e;
    }
    ++c_->parts_;
    c_->bytes_put_ += payload.size();
    return it->second;
  }

  // Best effort: servers without AbortMultipartUpload (s3rver answers 405) keep the parts
  // invisible; a bucket lifecycle rule cleans them up on AWS.
  void abort_locked() {
    if (upload_id_.empty()) return;
    s3_http_request r;
    r.method = "DELETE";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    (void)c_->perform(r, "AbortMultipartUpload", name_, /*max_attempts=*/2);
    ++c_->mp_aborted_;
    upload_id_.clear();
  }

  std::shared_ptr<s3_client> c_;
  std::string name_, key_;
  std::size_t part_size_;
  std::mutex mu_, create_mu_;
  std::map<std::uint64_t, part> parts_;
  std::uint64_t end_ = 0;
  std::string upload_id_;
  bool finished_ = false;
  std::optional<error> failed_;
};

}  // namespace detail

/// Objects in an S3-compatible store under `s3://bucket/prefix`.
///
/// Endpoint, region and credentials come from s3_options or the usual environment variables
/// (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN);
/// requests are signed with SigV4. With a custom endpoint addressing is path-style
/// (http://endpoint/bucket/key), otherwise virtual-hosted (https://bucket.s3.region.amazonaws.com).
///
/// - `put` is one PUT: atomic on S3 (readers see the old or the new object), so committing
///   metadata.json with it is the commit point of a checkpoint.
/// - `open_writer` buffers parts of `part_size`; each complete part is uploaded by the thread
///   that completed it (multipart upload), `finish()` completes the upload. An object smaller
///   than a part is one PUT. A writer that fails or is dropped aborts its upload.
/// - `read` is a ranged GET of exactly the bytes asked for (see counters()).
/// - `list` is ListObjectsV2 with pagination; `size`/`exists` are HEAD; `remove` is HEAD then
///   DELETE (S3's DELETE does not say whether the object existed).
/// - Every request is retried with exponential backoff and jitter on 5xx, SlowDown,
///   RequestTimeout and connection errors, within s3_options::deadline; a request that gives up
///   is an errc::io error naming the key, the attempts and the last HTTP status or curl error.
/// - A bucket that does not exist is errc::not_found "bucket 'b' does not exist at <endpoint>"
///   from every call, `exists` included (a HEAD 404 is resolved with a HEAD of the bucket, once
///   per storage while the bucket exists).
/// - Error messages carry only the `<Code>` and `<Message>` of a server's error answer, bounded
///   in length, with credential material (secret key, session token, signatures, Authorization
///   header) redacted, whatever the server sends back.
/// - Only http:// and https:// are spoken (libcurl is restricted to them, redirects included).
///
/// Every member is thread-safe. Copying is not allowed; moving is.
class s3_storage {
 public:
  /// Opens `s3://bucket[/prefix]`; throws cairn::exception (errc::invalid_argument) on a bad URI
  /// or bucket name, or an endpoint that is not `http(s)://host[:port]` (e.g. `file://`).
  explicit s3_storage(std::string_view uri, s3_options opt = {}) {
    auto parsed = detail::parse_s3_uri(uri);
    if (!parsed) throw exception(parsed.err());
    c_ = std::make_shared<detail::s3_client>(parsed->first, parsed->second, std::move(opt));
  }

  /// Atomically replaces (or creates) `name` with `data` (one PUT).
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    CAIRN_TRY(detail::check_name(name));
    forget_cached(name);
    detail::s3_http_request r;
    r.method = "PUT";
    r.key = c_->key_of(name);
    r.body = data;
    r.upload = true;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "PUT", name));
    if (resp.status != 200) return c_->http_error(resp, "PUT", r.key, name);
    ++c_->puts_;
    c_->bytes_put_ += data.size();
    return ok();
  }

  /// A writer whose bytes become the object `name` when `finish()` succeeds.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY(detail::check_name(name));
    forget_cached(name);
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::s3_writer>(c_, std::string(name)));
  }

  /// Fills `out` with the bytes of `name` from `offset` (one ranged GET); errc::corrupt
  /// "truncated" when the object is shorter, errc::not_found when it is missing.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    CAIRN_TRY(detail::check_name(name));
    if (!c_->options().cache_dir.empty()) return read_cached(name, offset, out);
    if (out.empty()) {
      CAIRN_TRY_ASSIGN(auto n, size(name));
      if (offset > n) return truncated(name, offset, 0, n);
      return ok();
    }
    detail::s3_http_request r;
    r.method = "GET";
    r.key = c_->key_of(name);
    const std::uint64_t last = offset + out.size() - 1;
    r.headers = {{"Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(last)}};
    r.out = out;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "GET", name));
    if (resp.status == 416) {
      // The range starts at or past the end: the object's size is in Content-Range or a HEAD.
      std::uint64_t total = content_range_total(resp).value_or(0);
      if (!content_range_total(resp)) {
        CAIRN_TRY_ASSIGN(auto n, size(name));
        total = n;
      }
      return truncated(name, offset, 0, total);
    }
    if (resp.status == 200) {
      // A server that ignores Range sends the whole object: keep the requested window.
      error e = make_error(errc::io, "S3 GET of key \"" + r.key + "\" ignored the Range header");
      e.file = describe(name);
      return e;
    }
    if (resp.status != 206) return c_->http_error(resp, "GET", r.key, name);
    ++c_->gets_;
    c_->bytes_got_ += resp.received;
    if (resp.received < out.size()) {
      return truncated(name, offset, resp.received,
                       content_range_total(resp).value_or(offset + resp.received));
    }
    return ok();
  }

  /// The size of `name` in bytes (HEAD); errc::not_found when missing.
  result<std::uint64_t> size(std::string_view name) const {
    CAIRN_TRY(detail::check_name(name));
    CAIRN_TRY_ASSIGN(auto resp, head(name));
    if (resp.status != 200) return c_->http_error(resp, "HEAD", c_->key_of(name), name);
    auto it = resp.headers.find("content-length");
    if (it == resp.headers.end()) {
      error e = make_error(
          errc::io, "S3 HEAD of key \"" + c_->key_of(name) + "\" returned no Content-Length");
      e.file = describe(name);
      return e;
    }
    return static_cast<std::uint64_t>(std::strtoull(it->second.c_str(), nullptr, 10));
  }

  /// Whether `name` exists (HEAD).
  result<bool> exists(std::string_view name) const {
    CAIRN_TRY(detail::check_name(name));
    CAIRN_TRY_ASSIGN(auto resp, head(name));
    if (resp.status == 200) return true;
    if (resp.status == 404) return false;
    return c_->http_error(resp, "HEAD", c_->key_of(name), name);
  }

  /// The sorted names that start with `prefix` (ListObjectsV2, every page).
  result<std::vector<std::string>> list(std::string_view prefix) const {
    CAIRN_TRY(detail::check_prefix(prefix));
    const std::string kp = c_->key_prefix();
    std::vector<std::string> names;
    std::string token;
    while (true) {
      detail::s3_http_request r;
      r.method = "GET";
      r.query = {{"list-type", "2"},
                 {"prefix", kp + std::string(prefix)},
                 {"max-keys", std::to_string(c_->options().list_page_size)}};
      if (!token.empty()) r.query.emplace_back("continuation-token", token);
      CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "ListObjectsV2", prefix));
      if (resp.status != 200)
        return c_->http_error(resp, "ListObjectsV2", kp + std::string(prefix), prefix);
      ++c_->lists_;
      for (auto& k : detail::xml_all(resp.text, "Key")) {
        if (k.starts_with(kp)) names.push_back(k.substr(kp.size()));
      }
      if (detail::xml_first(resp.text, "IsTruncated") != "true") break;
      token = detail::xml_first(resp.text, "NextContinuationToken");
      if (token.empty()) break;
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  /// Deletes `name`; errc::not_found when missing.
  result<void> remove(std::string_view name) {
    CAIRN_TRY(detail::check_name(name));
    forget_cached(name);
    CAIRN_TRY_ASSIGN(bool there, exists(name));
    if (!there) return missing(name);
    detail::s3_http_request r;
    r.method = "DELETE";
    r.key = c_->key_of(name);
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "DELETE", name));
    if (resp.status != 204 && resp.status != 200)
      return c_->http_error(resp, "DELETE", r.key, name);
    ++c_->deletes_;
    return ok();
  }

  /// "s3://bucket/prefix/name".
  std::string describe(std::string_view name) const { return c_->describe(name); }

  /// What this storage sent and received so far.
  s3_counters counters() const { return c_->counters(); }

  /// The SigV4 signature this storage would send for a request (tests compare it with the AWS
  /// SDK's): `method` on object `name` (empty: the bucket), raw `query` pairs, extra signed
  /// `headers`, a body, at `amz_date` ("YYYYMMDDTHHMMSSZ").
  detail::sigv4::signed_headers sign_for_test(
      std::string method,
      std::string_view name,
      std::vector<std::pair<std::string, std::string>> query,
      std::vector<std::pair<std::string, std::string>> headers,
      std::span<const std::byte> body,
      const std::string& amz_date) const {
    detail::s3_http_request r;
    r.method = std::move(method);
    r.key = name.empty() ? std::string() : c_->key_of(name);
    r.query = std::move(query);
    r.headers = std::move(headers);
    r.body = body;
    return c_->sign(r, amz_date);
  }

 private:
  result<detail::s3_http_response> head(std::string_view name) const {
    detail::s3_http_request r;
    r.method = "HEAD";
    r.key = c_->key_of(name);
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "HEAD", name));
    if (resp.status == 200 || resp.status == 404) ++c_->heads_;
    // A HEAD answer has no body: a 404 may mean "no such key" or "no such bucket".
    if (resp.status == 404) CAIRN_TRY(c_->check_bucket(name));
    return resp;
  }

  static std::optional<std::uint64_t> content_range_total(const detail::s3_http_response& resp) {
    auto it = resp.headers.find("content-range");
    if (it == resp.headers.end()) return std::nullopt;
    auto slash = it->second.rfind('/');
    if (slash == std::string::npos || it->second.substr(slash + 1) == "*") return std::nullopt;
    return std::strtoull(it->second.c_str() + slash + 1, nullptr, 10);
  }

  error truncated(std::string_view name,
                  std::uint64_t offset,
                  std::uint64_t got,
                  std::uint64_t object_size) const {
    error e =
        make_error(errc::corrupt, "truncated: reading bytes at offset " + std::to_string(offset) +
                                      " of " + describe(name) + ", the object ends at byte " +
                                      std::to_string(object_size));
    e.file = describe(name);
    e.offset = offset + got;
    e.rank = c_->options().rank;
    return e;
  }

  error missing(std::string_view name) const {
    error e = make_error(errc::not_found, "no object " + describe(name));
    e.file = describe(name);
    e.rank = c_->options().rank;
    return e;
  }

  // ---- pre-download into cache_dir ----
  struct cache_entry {
    std::mutex mu;
    bool ready = false;
    std::string path;
    std::uint64_t size = 0;
  };

  void forget_cached(std::string_view name) {
    if (c_->options().cache_dir.empty()) return;
    std::lock_guard lock(cache_->mu);
    cache_->entries.erase(std::string(name));
  }

  result<void> read_cached(std::string_view name,
                           std::uint64_t offset,
                           std::span<std::byte> out) const {
    std::shared_ptr<cache_entry> ent;
    {
      std::lock_guard lock(cache_->mu);
      auto& slot = cache_->entries[std::string(name)];
      if (!slot) slot = std::make_shared<cache_entry>();
      ent = slot;
    }
    {
      std::lock_guard lock(ent->mu);
      if (!ent->ready) {
        namespace fs = std::filesystem;
        fs::path p = fs::path(c_->options().cache_dir) / c_->bucket() / c_->key_of(name);
        std::error_code ec;
        fs::create_directories(p.parent_path(), ec);
        std::string tmp = p.string() + ".part";
        int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
          error e = make_error(errc::io, "cannot create " + tmp + ": " + std::strerror(errno));
          e.file = tmp;
          return e;
        }
        detail::s3_http_request r;
        r.method = "GET";
        r.key = c_->key_of(name);
        r.out_fd = fd;
        auto resp = c_->perform(r, "GET", name);
        ::close(fd);
        if (!resp || resp->status != 200) {
          ::unlink(tmp.c_str());
          if (!resp) return resp.err();
          return c_->http_error(*resp, "GET", r.key, name);
        }
        ++c_->gets_;
        c_->bytes_got_ += resp->received;
        fs::rename(tmp, p, ec);
        if (ec) {
          error e = make_error(errc::io, "cannot rename " + tmp + ": " + ec.message());
          e.file = p.string();
          return e;
        }
        ent->path = p.string();
        ent->size = resp->received;
        ent->ready = true;
      }
    }
    if (offset > ent->size || out.size() > ent->size - offset)
      return truncated(name, offset, offset < ent->size ? ent->size - offset : 0, ent->size);
    int fd = ::open(ent->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error e = make_error(errc::io, "cannot open " + ent->path + ": " + std::strerror(errno));
      e.file = ent->path;
      return e;
    }
    std::size_t done = 0;
    while (done < out.size()) {
      ssize_t n =
          ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        error e = make_error(errc::io, "cannot read " + ent->path);
        e.file = ent->path;
        e.offset = offset + done;
        return e;
      }
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return ok();
  }

  struct cache_map {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<cache_entry>> entries;
  };

  std::shared_ptr<detail::s3_client> c_;
  std::shared_ptr<cache_map> cache_ = std::make_shared<cache_map>();
};

static_assert(storage<s3_storage>);

/// True when `path` is an `s3://` URI (the CLI and tools choose the backend with it).
inline bool is_s3_uri(std::string_view path) { return path.starts_with("s3://"); }

}  // namespace cairn
