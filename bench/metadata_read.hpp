// bench/metadata_read.hpp: `cairn-bench --metadata`: what `read_metadata` costs on a checkpoint
// of format version 5 saved by many ranks (an index file per key owner), through storage that
// answers each call after a fixed latency (an object store's first byte; 0: memory speed).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/memory.hpp"

namespace cairn_bench {

/// Storage whose every read and size call returns after `latency` (the calls of one thread run
/// one after another; calls on different threads overlap, as requests to a server do).
class latency_storage : public cairn::storage_decorator<cairn::memory_storage> {
 public:
  latency_storage(cairn::memory_storage& inner, std::chrono::microseconds latency)
      : storage_decorator(inner), latency_(latency) {}
  cairn::result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    std::this_thread::sleep_for(latency_);
    return storage_decorator::read(name, offset, out);
  }
  cairn::result<std::uint64_t> size(std::string_view name) {
    std::this_thread::sleep_for(latency_);
    return storage_decorator::size(name);
  }

 private:
  std::chrono::microseconds latency_;
};

/// Saves `tensors` tensors of (2 × ranks) × 64 f32, each split by rows over `ranks` thread ranks,
/// into memory, then reads its metadata `reps` times through `latency_us` of latency per call; JSON
/// with the median milliseconds, the index files and their bytes.
inline std::string simulate_metadata_read(int ranks, int tensors, int latency_us, int reps) {
  cairn::memory_storage mem;
  cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
    std::vector<std::vector<float>> data(static_cast<std::size_t>(tensors));
    cairn::state_dict sd;
    const std::int64_t rows = 2 * static_cast<std::int64_t>(ranks);
    for (int t = 0; t < tensors; ++t) {
      const std::string key = "layers." + std::to_string(t) + ".weight";
      const std::int64_t lo = rows * comm.rank() / ranks, hi = rows * (comm.rank() + 1) / ranks;
      auto& d = data[static_cast<std::size_t>(t)];
      d.assign(static_cast<std::size_t>((hi - lo) * 64), static_cast<float>(t));
      sd.add(key, cairn::block(key, std::span(d), {hi - lo, 64}, {rows, 64}, {lo, 0}));
    }
    cairn::save(sd, mem, comm);
  });
  latency_storage slow(mem, std::chrono::microseconds(latency_us));
  std::vector<double> ms;
  std::uint64_t index_files = 0, index_bytes = 0, chunks = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cairn::checkpoint_metadata m = cairn::read_metadata(slow).value();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    index_files = index_bytes = chunks = 0;
    for (const auto& f : m.files)
      if (f.role == cairn::file_role::index) ++index_files, index_bytes += f.nbytes;
    for (const auto& [k, t] : m.tensors) chunks += t.chunks.size();
  }
  std::sort(ms.begin(), ms.end());
  return fmt::format(
      "{{\"bench\":\"cairn-metadata-read\",\"ranks\":{},\"tensors\":{},\"latency_us\":{},"
      "\"index_files\":{},\"index_bytes\":{},\"chunks\":{},\"read_metadata_ms_median\":{:.1f},"
      "\"reps\":{}}}",
      ranks, tensors, latency_us, index_files, index_bytes, chunks, ms[ms.size() / 2], reps);
}

}  // namespace cairn_bench
