// cairn/storage/s3/client.hpp: s3_client, the state an s3_storage and its writers share:
// configuration (options completed from the environment, endpoint, addressing), SigV4 signing, a
// pool of libcurl handles under a bound on requests in flight, the retry loop, the errors of
// failed requests, and the counters.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/s3/endpoint.hpp"
#include "cairn/storage/s3/errors.hpp"
#include "cairn/storage/s3/http.hpp"
#include "cairn/storage/s3/options.hpp"
#include "cairn/storage/s3/sigv4.hpp"
#include "cairn/storage/s3/xml.hpp"

namespace cairn::detail {

/// Shared state of an s3_storage: configuration, handle pool, request bound, counters. Writers
/// keep it alive.
class s3_client {
 public:
  /// Completes `opt` from the environment (AWS_*) and checks the region and endpoint; throws
  /// cairn::exception (errc::invalid_argument) on a bad one.
  s3_client(std::string bucket, std::string prefix, s3_options opt)
      : bucket_(std::move(bucket)), prefix_(std::move(prefix)), opt_(std::move(opt)) {
    static const bool curl_ready = [] { return ::curl_global_init(CURL_GLOBAL_DEFAULT) == 0; }();
    (void)curl_ready;
    options_from_environment(opt_);
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
    if (!opt_.allow_small_parts && opt_.part_size < s3_min_part_size)
      opt_.part_size = s3_min_part_size;
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
    const auto start = clock::now();
    const auto deadline = start + opt_.deadline;
    int attempts_allowed = max_attempts > 0 ? max_attempts : opt_.max_attempts;
    // After an operation gave up on an unreachable server, later ones try once until it answers.
    if (clock::now().time_since_epoch().count() < unreachable_until_.load()) attempts_allowed = 1;
    for (int attempt = 0;; ++attempt) {
      if (attempt > 0) ++retries_;
      s3_http_response resp = attempt_once(r, deadline);
      attempt_outcome outcome = judge(resp);
      // Any HTTP answer, a retryable one included, says the server is reachable again.
      if (resp.curl == CURLE_OK) unreachable_until_.store(0);
      if (outcome.final_answer) return resp;
      const std::int64_t delay_ms = backoff_ms(attempt);
      if (attempt + 1 >= attempts_allowed ||
          clock::now() + std::chrono::milliseconds(delay_ms) >= deadline) {
        if (resp.curl != CURLE_OK)
          unreachable_until_.store((clock::now() + opt_.deadline).time_since_epoch().count());
        return gave_up(r, what, name, attempt + 1, start, outcome.last);
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
  using clock = std::chrono::steady_clock;

  /// Fills the empty strings of `opt` from the environment (see s3_options).
  static void options_from_environment(s3_options& opt) {
    auto env = [](const char* n) -> std::string {
      const char* v = std::getenv(n);
      return v ? v : "";
    };
    if (opt.endpoint.empty()) opt.endpoint = env("AWS_ENDPOINT_URL");
    if (opt.region.empty()) opt.region = env("AWS_REGION");
    if (opt.region.empty()) opt.region = env("AWS_DEFAULT_REGION");
    if (opt.region.empty()) opt.region = "us-east-1";
    if (opt.access_key.empty()) opt.access_key = env("AWS_ACCESS_KEY_ID");
    if (opt.secret_key.empty()) opt.secret_key = env("AWS_SECRET_ACCESS_KEY");
    if (opt.session_token.empty()) opt.session_token = env("AWS_SESSION_TOKEN");
  }

  /// What one attempt came to: an answer to hand back (`final_answer`), or a failure worth
  /// another attempt, described by `last` ("last HTTP status 503 SlowDown: ..." or "curl: ...").
  struct attempt_outcome {
    bool final_answer = false;
    std::string last;
  };

  /// Judges an attempt: every curl error is tried again; an HTTP answer is final unless it is a
  /// 5xx, a 429, SlowDown, RequestTimeout, InternalError, or a 200 with an <Error> body (which
  /// CompleteMultipartUpload may send).
  attempt_outcome judge(const s3_http_response& resp) const {
    attempt_outcome out;
    if (resp.curl != CURLE_OK) {
      out.last = std::string("curl: ") + ::curl_easy_strerror(resp.curl) +
                 (resp.curl_error.empty() ? "" : " (" + server_text(resp.curl_error, resp) + ")");
      return out;
    }
    std::string code = sigv4_error_code(resp);
    out.last = "last HTTP status " + std::to_string(resp.status) + status_text(resp, code);
    const bool retry = resp.status >= 500 || code == "SlowDown" || code == "RequestTimeout" ||
                       code == "InternalError" || resp.status == 429 ||
                       (resp.status == 200 && resp.text.find("<Error>") != std::string::npos);
    out.final_answer = !retry;
    return out;
  }

  /// The delay before the retry after attempt `attempt` (0-based): "equal jitter", a delay in
  /// [cap/2, cap] where cap doubles from backoff_initial up to backoff_max.
  std::int64_t backoff_ms(int attempt) {
    auto cap = std::min<std::int64_t>(opt_.backoff_max.count(), opt_.backoff_initial.count()
                                                                    << std::min(attempt, 20));
    std::lock_guard lock(rng_mu_);
    return cap / 2 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(cap / 2 + 1));
  }

  /// The errc::io error of a request that gave up after `attempts` attempts since `start`.
  error gave_up(const s3_http_request& r,
                std::string_view what,
                std::string_view name,
                int attempts,
                clock::time_point start,
                const std::string& last) const {
    double secs = std::chrono::duration<double>(clock::now() - start).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f", secs);
    error e = make_error(
        errc::io, redact("S3 " + std::string(what) + " of key \"" + r.key + "\" in bucket \"" +
                         bucket_ + "\" gave up after " + std::to_string(attempts) +
                         " attempt(s) in " + took + " s: " + last));
    e.file = describe(name);
    e.rank = opt_.rank;
    return e;
  }

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

  /// Waits for a free request slot (max_concurrent_requests) and takes a pooled handle, or a new
  /// one (null when libcurl cannot make one; the slot is still taken: release(nullptr)).
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

  /// The header lines of a request signed with `sig`.
  std::vector<std::string> header_lines(const s3_http_request& r,
                                        const sigv4::signed_headers& sig) const {
    std::vector<std::string> lines{"Host: " + host_, "x-amz-date: " + sig.amz_date,
                                   "x-amz-content-sha256: " + r.body_sha256};
    if (!cred_.session_token.empty())
      lines.push_back("x-amz-security-token: " + cred_.session_token);
    for (const auto& [k, v] : r.headers) lines.push_back(k + ": " + v);
    lines.push_back("Authorization: " + sig.authorization);
    lines.push_back("Expect:");
    if (r.method != "PUT" && r.method != "POST") lines.push_back("Transfer-Encoding:");
    return lines;
  }

  /// One attempt of `r`: signed now, sent on a pooled handle, bounded by `deadline`.
  s3_http_response attempt_once(s3_http_request& r, clock::time_point deadline) {
    s3_http_response resp;
    ++requests_;
    std::string query = sigv4::canonical_query(r.query);
    if (opt_.on_request) opt_.on_request(r.method, r.key, query);
    CURL* h = acquire();
    if (!h) {
      release(nullptr);
      resp.curl = CURLE_OUT_OF_MEMORY;
      return resp;
    }
    const std::string url = base_url_ + path_of(r.key) + (query.empty() ? "" : "?" + query);
    auto sig = sign(r, sigv4::amz_date(std::time(nullptr)));
    resp.authorization = sig.authorization;
    resp.signature = sig.signature;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    s3_http_limits lim;
    lim.connect_timeout_ms = static_cast<long>(opt_.connect_timeout.count());
    lim.timeout_ms = static_cast<long>(std::max<std::int64_t>(left.count(), 200));
    lim.stall_seconds = static_cast<long>(opt_.stall_timeout.count());
    s3_http_exchange(h, r, url, header_lines(r, sig), lim, resp);
    release(h);
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
  std::atomic<std::int64_t> unreachable_until_{0};
};

}  // namespace cairn::detail
