// cairn/detail/parallel.hpp: run independent I/O tasks on a few threads, keeping the first
// error.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cairn/core/error.hpp"

namespace cairn::detail {

/// Runs `task(i)` for i in [0, count) on up to `threads` threads (the caller's thread is one
/// of them). Tasks are taken in index order. After the first failure no new task starts; the
/// first error (by time) is returned. Exceptions thrown by a task become errc::io errors.
template <class Task>
result<void> run_parallel(std::size_t count, int threads, Task&& task) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::optional<error> first;
  auto record = [&](error e) {
    std::lock_guard lock(mu);
    if (!first) first = std::move(e);
    failed = true;
  };
  auto worker = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      std::size_t i = next.fetch_add(1);
      if (i >= count) return;
      try {
        result<void> r = task(i);
        if (!r) record(std::move(r).err());
      } catch (const exception& e) {
        record(e.err());
      } catch (const std::exception& e) {
        record(make_error(errc::io, e.what()));
      }
    }
  };
  std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), count);
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (first) return std::move(*first);
  return ok();
}

}  // namespace cairn::detail
