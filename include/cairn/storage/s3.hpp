// cairn/storage/s3.hpp: s3_storage, a backend for S3-compatible object stores (AWS S3, MinIO,
// R2, GCS's S3 API, s3rver) over libcurl with SigV4 signing written in cairn (OpenSSL). Part of
// the optional target cairn::s3. The one header to include; its parts live in storage/s3/:
//
//   options.hpp   s3_options, s3_counters
//   endpoint.hpp  s3:// URIs and http(s) endpoints
//   sigv4.hpp     AWS Signature Version 4
//   xml.hpp       the XML of S3 answers
//   errors.hpp    what of a server's answer may go into an error (credentials redacted)
//   http.hpp      one HTTP exchange over libcurl
//   client.hpp    s3_client: signing, handle pool, retries, request errors, counters
//   writer.hpp    s3_writer: multipart uploads
//   storage.hpp   s3_storage
//
// Including this header also registers the s3:// scheme with open_storage (storage/open.hpp).
#pragma once

#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/open.hpp"
#include "cairn/storage/s3/endpoint.hpp"
#include "cairn/storage/s3/options.hpp"
#include "cairn/storage/s3/storage.hpp"

namespace cairn {

namespace detail {

/// open_storage's opener of s3:// URIs: an s3_storage with default options (the environment's
/// endpoint, region and credentials).
inline result<any_storage> open_s3_uri(std::string_view uri) {
  try {
    return any_storage(s3_storage(uri));
  } catch (...) {
    return current_exception_error("opening an S3 storage");
  }
}

/// Registers open_s3_uri for "s3" once per program, before main (any translation unit that
/// includes this header is enough).
[[maybe_unused]] inline const bool s3_scheme_registered =
    (register_storage_scheme("s3", &open_s3_uri), true);

}  // namespace detail

}  // namespace cairn
