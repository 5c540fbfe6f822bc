// cairn/storage/open.hpp: open_storage(uri), the storage a path or URI names, through a registry
// of URI schemes. Built in: plain paths and file:// (file_storage), memory:// (a named
// memory_storage shared by the whole process). cairn/storage/s3.hpp registers s3:// when it is
// included, so this header never needs libcurl; a program may register schemes of its own.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"

namespace cairn {

/// Opens the storage of a URI of one scheme; it receives the whole URI ("s3://bucket/prefix").
using storage_opener = std::function<result<any_storage>(std::string_view uri)>;

namespace detail {

struct storage_scheme_registry {
  std::mutex mu;
  std::map<std::string, storage_opener, std::less<>> openers;
  std::map<std::string, std::shared_ptr<memory_storage>, std::less<>> memories;
};

/// The process-wide registry (one per program: an inline function's static).
inline storage_scheme_registry& storage_schemes_state() {
  static storage_scheme_registry r;
  return r;
}

/// The scheme of "scheme://rest", lower-cased, or empty when `uri` does not start with one (a
/// scheme is a letter followed by letters, digits, '+', '-' or '.').
inline std::string uri_scheme(std::string_view uri) {
  std::size_t sep = uri.find("://");
  if (sep == std::string_view::npos || sep == 0) return {};
  std::string scheme(uri.substr(0, sep));
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(scheme[i]);
    const bool ok =
        std::isalpha(c) || (i > 0 && (std::isdigit(c) || c == '+' || c == '-' || c == '.'));
    if (!ok) return {};
    scheme[i] = static_cast<char>(std::tolower(c));
  }
  return scheme;
}

inline result<any_storage> open_file_uri(std::string_view uri) {
  std::string_view path = uri;
  if (!uri_scheme(uri).empty()) path.remove_prefix(uri.find("://") + 3);
  if (path.empty())
    return make_error(errc::invalid_argument,
                      "no path in \"" + std::string(uri) + "\" (expected file:///dir or a path)");
  return any_storage(file_storage(std::filesystem::path(path)));
}

}  // namespace detail

/// Makes `open` the opener of URIs "`scheme`://..." (case-insensitive), replacing an earlier one
/// of that scheme (the built-in `file` and `memory` included). Thread-safe.
///
/// ```
/// cairn::register_storage_scheme("kv", [](std::string_view uri) ->
/// cairn::result<cairn::any_storage> {
///   return cairn::any_storage(kv_storage(uri));
/// });
/// ```
inline void register_storage_scheme(std::string_view scheme, storage_opener open) {
  std::string key(scheme);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto& r = detail::storage_schemes_state();
  std::lock_guard lock(r.mu);
  r.openers[key] = std::move(open);
}

/// The process-wide memory_storage that `memory://name` opens: created empty on first use and
/// kept until the process ends, so every `open_storage("memory://name")` sees the same objects.
inline std::shared_ptr<memory_storage> named_memory_storage(std::string_view name) {
  auto& r = detail::storage_schemes_state();
  std::lock_guard lock(r.mu);
  auto it = r.memories.find(name);
  if (it == r.memories.end())
    it = r.memories.emplace(std::string(name), std::make_shared<memory_storage>()).first;
  return it->second;
}

/// The schemes `open_storage` knows now, sorted ("file", "memory", and "s3" once
/// cairn/storage/s3.hpp is part of the program).
inline std::vector<std::string> storage_schemes() {
  auto& r = detail::storage_schemes_state();
  std::vector<std::string> out{"file", "memory"};
  {
    std::lock_guard lock(r.mu);
    for (const auto& [scheme, open] : r.openers) out.push_back(scheme);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// The storage that `uri` names, owned by the returned handle:
/// - a plain path ("ckpt/step_100", "/data/ckpt") or `file://path` (`file:///data/ckpt`):
///   a `file_storage` rooted there (created on the first write);
/// - `memory://name`: the process-wide `named_memory_storage(name)`;
/// - `s3://bucket/prefix`: an `s3_storage` with endpoint and credentials from the environment
///   (`AWS_*`), when cairn/storage/s3.hpp is part of the program (target cairn::s3);
/// - any scheme given to `register_storage_scheme`.
///
/// An unknown scheme is errc::invalid_argument naming the URI and the known schemes; a URI its
/// opener refuses is that opener's error (errc::invalid_argument naming it for the built-in
/// ones and s3://). Keep the handle alive while anything references the storage.
inline result<any_storage> open_storage(std::string_view uri) {
  if (uri.empty()) return make_error(errc::invalid_argument, "empty storage path or URI");
  std::string scheme = detail::uri_scheme(uri);
  if (scheme.empty() && uri.find("://") == std::string_view::npos)
    return detail::open_file_uri(uri);
  storage_opener open;
  {
    auto& r = detail::storage_schemes_state();
    std::lock_guard lock(r.mu);
    if (auto it = r.openers.find(scheme); it != r.openers.end()) open = it->second;
  }
  if (open) return open(uri);
  if (scheme == "file") return detail::open_file_uri(uri);
  if (scheme == "memory")
    return any_storage(named_memory_storage(uri.substr(std::string_view("memory://").size())));
  std::string known;
  for (const std::string& s : storage_schemes()) known += (known.empty() ? "" : ", ") + s + "://";
  return make_error(
      errc::invalid_argument,
      "unknown storage URI scheme in \"" + std::string(uri) + "\" (known: " + known +
          (scheme == "s3" ? "; s3:// needs cairn/storage/s3.hpp, target cairn::s3" : "") + ")");
}

}  // namespace cairn
