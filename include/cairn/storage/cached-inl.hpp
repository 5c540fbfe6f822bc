// cairn/storage/cached-inl.hpp: the bodies of cairn/storage/cached.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "cairn/storage/cached.hpp"

namespace cairn::detail {

CAIRN_INLINE std::shared_ptr<cache_entry> cache_state::entry(std::string_view name) {
  std::lock_guard lock(mu);
  auto it = entries.find(name);
  if (it == entries.end())
    it = entries.emplace(std::string(name), std::make_shared<cache_entry>()).first;
  return it->second;
}

CAIRN_INLINE void cache_state::drop(std::string_view name, const std::shared_ptr<cache_entry>& e) {
  std::lock_guard lock(mu);
  e->stale.store(true);
  auto it = entries.find(name);
  if (it != entries.end() && it->second == e) entries.erase(it);
  if (!e->path.empty()) ::unlink(e->path.c_str());
}

CAIRN_INLINE result<void> cache_invalidating_writer::finish() {
  return state_->changing(name_, [&] { return inner_->finish(); });
}

CAIRN_INLINE std::string unique_cache_subdir() {
  static std::atomic<std::uint64_t> next{0};
  return "cairn-cache-" + std::to_string(::getpid()) + "-" + std::to_string(next.fetch_add(1));
}

}  // namespace cairn::detail
