// cairn/storage/s3/options.hpp: s3_options, how an s3_storage reaches its server and retries, and
// s3_counters, what it did. Throttling, writer slots and pre-download are decorators
// (storage/throttled.hpp, storage/writer_slots.hpp, storage/cached.hpp), not options.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace cairn {

/// The smallest part S3 accepts in a multipart upload (all parts but the last).
inline constexpr std::size_t s3_min_part_size = std::size_t{5} << 20;

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
  /// Multipart part size of object writers, raised to `s3_min_part_size` (5 MiB) unless
  /// `allow_small_parts`: S3 refuses a smaller part other than the last with EntityTooSmall at
  /// the upload's completion (AWS, MinIO and moto do; s3rver does not). An object whose writer
  /// never fills a whole part is uploaded with one PUT.
  std::size_t part_size = std::size_t{16} << 20;
  /// Keep a `part_size` below 5 MiB, for servers that accept small parts (tests that exercise
  /// multipart uploads with little data against s3rver or a fake).
  bool allow_small_parts = false;
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
}  // namespace cairn
