// A small training state shared by the tests of the save strategies (tests/strategies_test.cpp,
// tests/format/*/strategy_test.cpp, ...): a row-sharded f32 tensor, common values of every kind
// and a per-rank RNG object; and storage helpers that list and count what a save wrote.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/memory.hpp"

namespace cairn_test {

inline std::vector<std::string> sorted_names(cairn::memory_storage& mem) {
  auto names = mem.list("").value();
  std::sort(names.begin(), names.end());
  return names;
}

/// Counts the bytes read from data files ("data.*"), not the metadata or index reads around
/// them.
class data_read_counter : public cairn::storage_decorator<cairn::memory_storage> {
 public:
  explicit data_read_counter(cairn::memory_storage& m) : storage_decorator(m) {}
  cairn::result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    if (name.starts_with("data.")) data_bytes += out.size();
    return storage_decorator::read(name, offset, out);
  }
  std::uint64_t data_bytes_read() const { return data_bytes.load(); }
  std::atomic<std::uint64_t> data_bytes{0};
};

struct rng_state {
  std::uint64_t s[2];
};

struct train_state {
  std::vector<float> w_data;
  cairn::sharded_tensor<float> w;
  std::int32_t step = 0;
  float lr = 0;
  bool warm = false;
  std::string run;
  std::vector<std::int64_t> sched;
  cairn::sharded_object<rng_state> rng;
  static constexpr auto fields =
      cairn::field_names("", "w", "step", "lr", "warm", "run", "sched", "rng");
};

inline void make_state(train_state& s, int rank, int world, float seed) {
  s.w_data.resize(12 / world * 5);
  for (std::size_t i = 0; i < s.w_data.size(); ++i)
    s.w_data[i] = seed + static_cast<float>(rank * 100 + static_cast<int>(i));
  s.w = cairn::from_rank_offsets("w", std::span(s.w_data), {12 / world, 5}, {{0, rank, world}});
  s.rng = cairn::per_rank("rng", rng_state{{7u + rank, 9}}, rank, world);
}

/// A (rows, 256) i64 tensor of small counters (compresses well), rank r of `world` holding a
/// row block; the data views `buf`.
inline cairn::sharded_tensor<std::int64_t> counters(std::vector<std::int64_t>& buf,
                                                    std::int64_t rows,
                                                    int r,
                                                    int world) {
  std::int64_t lo = rows * r / world, hi = rows * (r + 1) / world;
  buf.resize(static_cast<std::size_t>((hi - lo) * 256));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(buf.size()); ++i)
    buf[static_cast<std::size_t>(i)] = (lo * 256 + i) % 97;
  cairn::sharded_tensor<std::int64_t> t;
  t.key = "counters";
  t.type = cairn::dtype::i64;
  t.local_shape = {hi - lo, 256};
  t.global_shape = {rows, 256};
  t.global_offset = {lo, 0};
  t.data = buf;
  return t;
}

}  // namespace cairn_test
