// cairn/storage/s3/storage.hpp: s3_storage, the storage backend over an S3-compatible object
// store: each storage call as S3 requests through the shared s3_client.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/names.hpp"
#include "cairn/storage/s3/client.hpp"
#include "cairn/storage/s3/endpoint.hpp"
#include "cairn/storage/s3/options.hpp"
#include "cairn/storage/s3/writer.hpp"
#include "cairn/storage/s3/xml.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

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
  /// S3 has been strongly consistent since December 2020: reads and lists after a write see it;
  /// a PUT is atomic; multipart objects appear on CompleteMultipartUpload.
  static constexpr storage_features features{.read_after_write = true,
                                             .list_after_write = true,
                                             .atomic_put = true,
                                             .writer_hidden_until_finish = true,
                                             .durable = true,
                                             .shared_between_processes = true};

  /// Opens `s3://bucket[/prefix]`; throws cairn::exception (errc::invalid_argument) on a bad URI
  /// or bucket name, or an endpoint that is not `http(s)://host[:port]` (e.g. `file://`).
  explicit s3_storage(std::string_view uri, s3_options opt = {}) {
    auto parsed = detail::parse_s3_uri(uri);
    if (!parsed) throw exception(parsed.err());
    c_ = std::make_shared<detail::s3_client>(parsed->first, parsed->second, std::move(opt));
  }

  /// Atomically replaces (or creates) `name` with `data` (one PUT).
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    CAIRN_TRY(check_object_name(name));
    detail::s3_http_request r;
    r.method = "PUT";
    r.key = c_->key_of(name);
    r.body = data;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "PUT", name));
    if (resp.status != 200) return c_->http_error(resp, "PUT", r.key, name);
    ++c_->puts_;
    c_->bytes_put_ += data.size();
    return ok();
  }

  /// A writer whose bytes become the object `name` when `finish()` succeeds.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
    return std::unique_ptr<object_writer>(
        std::make_unique<detail::s3_writer>(c_, std::string(name)));
  }

  /// Fills `out` with the bytes of `name` from `offset` (one ranged GET); errc::corrupt
  /// "truncated" when the object is shorter, errc::not_found when it is missing.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    CAIRN_TRY(check_object_name(name));
    if (out.empty()) {
      CAIRN_TRY_ASSIGN(auto n, size(name));
      if (offset > n) return truncated(name, offset, 0, n);
      return ok();
    }
    if (out.size() - 1 > UINT64_MAX - offset) {
      error e = make_error(errc::invalid_argument, "read range overflows on " + describe(name));
      e.file = describe(name);
      e.offset = offset;
      return e;
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
    // A server's answer is a claim to check: the bytes must be the range asked for.
    if (auto range = content_range(resp); range && range->first != offset) {
      error e = make_error(errc::io, "S3 GET of key \"" + r.key + "\" asked for bytes " +
                                         std::to_string(offset) + "-" + std::to_string(last) +
                                         " and was answered bytes starting at " +
                                         std::to_string(range->first));
      e.file = describe(name);
      e.offset = offset;
      return e;
    }
    // A server that sends on past the end of the range (s3rver does for "bytes=0-0") has sent
    // the range's bytes first: the rest was dropped (resp.overflow).
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
    CAIRN_TRY(check_object_name(name));
    CAIRN_TRY_ASSIGN(auto resp, head(name));
    if (resp.status != 200) return c_->http_error(resp, "HEAD", c_->key_of(name), name);
    auto it = resp.headers.find("content-length");
    if (it == resp.headers.end()) {
      error e = make_error(
          errc::io, "S3 HEAD of key \"" + c_->key_of(name) + "\" returned no Content-Length");
      e.file = describe(name);
      return e;
    }
    if (auto n = detail::parse_decimal(it->second)) return *n;
    error e =
        make_error(errc::io, "S3 HEAD of key \"" + c_->key_of(name) +
                                 "\" returned Content-Length \"" + it->second + "\", not a size");
    e.file = describe(name);
    return e;
  }

  /// Whether `name` exists (HEAD).
  result<bool> exists(std::string_view name) const {
    CAIRN_TRY(check_object_name(name));
    CAIRN_TRY_ASSIGN(auto resp, head(name));
    if (resp.status == 200) return true;
    if (resp.status == 404) return false;
    return c_->http_error(resp, "HEAD", c_->key_of(name), name);
  }

  /// The sorted names that start with `prefix` (ListObjectsV2, every page).
  result<std::vector<std::string>> list(std::string_view prefix) const {
    CAIRN_TRY(check_list_prefix(prefix));
    const std::string kp = c_->key_prefix();
    std::vector<std::string> names;
    std::string token;
    std::set<std::string> tokens_seen;  // a server repeating a token would list forever
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
      // A listing cut short would hide checkpoints from a scan and from retention.
      std::string problem;
      if (token.empty())
        problem = "said the listing is truncated but gave no NextContinuationToken";
      else if (!tokens_seen.insert(token).second)
        problem = "gave a continuation token it had given before";
      if (!problem.empty()) {
        error e = make_error(errc::io, "S3 ListObjectsV2 of prefix \"" + kp + std::string(prefix) +
                                           "\" " + problem + " (page " +
                                           std::to_string(tokens_seen.size() + 1) + ")");
        e.file = describe(prefix);
        return e;
      }
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  /// Deletes `name`; errc::not_found when missing.
  result<void> remove(std::string_view name) {
    CAIRN_TRY(check_object_name(name));
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

  // The object's size from "Content-Range: bytes A-B/SIZE" or "bytes */SIZE", when given.
  static std::optional<std::uint64_t> content_range_total(const detail::s3_http_response& resp) {
    auto it = resp.headers.find("content-range");
    if (it == resp.headers.end()) return std::nullopt;
    auto slash = it->second.rfind('/');
    if (slash == std::string::npos) return std::nullopt;
    return detail::parse_decimal(std::string_view(it->second).substr(slash + 1));
  }

  // The first and last byte of "Content-Range: bytes A-B/SIZE", when given and well formed.
  static std::optional<std::pair<std::uint64_t, std::uint64_t>> content_range(
      const detail::s3_http_response& resp) {
    auto it = resp.headers.find("content-range");
    if (it == resp.headers.end()) return std::nullopt;
    std::string_view v = it->second;
    if (!v.starts_with("bytes ")) return std::nullopt;
    v.remove_prefix(6);
    const auto dash = v.find('-'), slash = v.find('/');
    if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash)
      return std::nullopt;
    auto first = detail::parse_decimal(v.substr(0, dash));
    auto last = detail::parse_decimal(v.substr(dash + 1, slash - dash - 1));
    if (!first || !last) return std::nullopt;
    return std::pair{*first, *last};
  }

  error truncated(std::string_view name,
                  std::uint64_t offset,
                  std::uint64_t got,
                  std::uint64_t object_size) const {
    return detail::truncated_read(describe(name), offset, got, object_size)
        .with_rank(c_->options().rank);
  }

  error missing(std::string_view name) const {
    error e = make_error(errc::not_found, "no object " + describe(name));
    e.file = describe(name);
    e.rank = c_->options().rank;
    return e;
  }

  std::shared_ptr<detail::s3_client> c_;
};

static_assert(storage<s3_storage>);

}  // namespace cairn
