// cairn/storage/open-inl.hpp: the bodies of cairn/storage/open.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <filesystem>
#include <utility>

#include "cairn/storage/file.hpp"
#include "cairn/storage/open.hpp"

namespace cairn::detail {

CAIRN_INLINE storage_scheme_registry& storage_schemes_state() {
  static storage_scheme_registry r;
  return r;
}

CAIRN_INLINE std::string uri_scheme(std::string_view uri) {
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

CAIRN_INLINE result<any_storage> open_file_uri(std::string_view uri) {
  std::string_view path = uri;
  if (!uri_scheme(uri).empty()) path.remove_prefix(uri.find("://") + 3);
  if (path.empty())
    return make_error(errc::invalid_argument,
                      "no path in \"" + std::string(uri) + "\" (expected file:///dir or a path)");
  return any_storage(file_storage(std::filesystem::path(path)));
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE void register_storage_scheme(std::string_view scheme, storage_opener open) {
  std::string key(scheme);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto& r = detail::storage_schemes_state();
  std::lock_guard lock(r.mu);
  r.openers[key] = std::move(open);
}

CAIRN_INLINE std::shared_ptr<memory_storage> named_memory_storage(std::string_view name) {
  auto& r = detail::storage_schemes_state();
  std::lock_guard lock(r.mu);
  auto it = r.memories.find(name);
  if (it == r.memories.end())
    it = r.memories.emplace(std::string(name), std::make_shared<memory_storage>()).first;
  return it->second;
}

CAIRN_INLINE std::vector<std::string> storage_schemes() {
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

CAIRN_INLINE result<any_storage> open_storage(std::string_view uri) {
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
