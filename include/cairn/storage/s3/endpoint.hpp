// cairn/storage/s3/endpoint.hpp: parsing of what names an S3 location: `s3://bucket/prefix`
// URIs and `http(s)://host[:port]` endpoints, refusing anything that could point requests at
// another host or make libcurl speak another protocol.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "cairn/core/error.hpp"
#include "cairn/storage/names.hpp"

namespace cairn {

/// True when `path` is an `s3://` URI (the scheme in any case, as URI schemes are).
inline bool is_s3_uri(std::string_view path) {
  return path.size() >= 5 && (path[0] == 's' || path[0] == 'S') && path.substr(1, 4) == "3://";
}

namespace detail {

/// Parses "s3://bucket[/prefix]" into bucket and prefix (no leading or trailing '/').
inline result<std::pair<std::string, std::string>> parse_s3_uri(std::string_view uri) {
  constexpr std::string_view scheme = "s3://";
  if (!is_s3_uri(uri))
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
  if (!prefix.empty() && !object_name_problem(prefix).empty())
    return make_error(errc::invalid_argument,
                      "bad prefix in \"" + std::string(uri) + "\": " + object_name_problem(prefix));
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

}  // namespace detail
}  // namespace cairn
