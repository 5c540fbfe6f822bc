// Shared helpers for the save/load tests: deterministic tensor contents, random shardings,
// temporary directories, reading an object as text.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cairn.hpp"

namespace cairn_test {

/// Creates a fresh temporary directory and returns its path (the caller removes it).
inline std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "cairn-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

/// The whole object `name` of `st` as text (throws cairn::exception when it cannot be read).
inline std::string read_text(cairn::storage_ref st, const std::string& name) {
  std::string s(st.size(name).value(), '\0');
  st.read(name, 0, std::as_writable_bytes(std::span(s))).value();
  return s;
}

/// A fresh temporary directory that rank 0 of `comm` creates and every rank receives the path
/// of (collective; the caller removes it).
inline std::string shared_temp_dir(cairn::comm_ref comm) {
  std::string root;
  if (comm.rank() == 0) root = make_temp_dir();
  cairn::bytes msg(reinterpret_cast<const std::byte*>(root.data()),
                   reinterpret_cast<const std::byte*>(root.data()) + root.size());
  comm.broadcast(msg, 0);
  return std::string(reinterpret_cast<const char*>(msg.data()), msg.size());
}

/// A temporary directory removed at scope exit.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cairn-test-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

/// The byte at flat element `i`, byte `b`, of the global tensor `key` (deterministic).
inline std::byte value_byte(const std::string& key, std::int64_t i, std::size_t b) {
  std::uint64_t h =
      std::hash<std::string>{}(key) ^ (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull);
  h ^= (h >> 29) + b * 0xBF58476D1CE4E5B9ull;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 31;
  return static_cast<std::byte>(h & 0xff);
}

/// Fills a block of a global tensor (row-major `block` at `offset` of `global`) with the
/// deterministic values; for bool tensors bytes are 0/1.
inline void fill_block(const std::string& key,
                       cairn::dtype t,
                       const cairn::shape& global,
                       const cairn::box& block,
                       std::byte* out) {
  std::size_t es = cairn::dtype_size(t);
  std::int64_t n = block.volume();
  std::size_t nd = global.size();
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < nd; ++d) flat = flat * global[d] + block.offset[d] + idx[d];
    for (std::size_t b = 0; b < es; ++b) {
      std::byte v = value_byte(key, flat, b);
      if (t == cairn::dtype::bool_) v = static_cast<std::byte>(static_cast<unsigned>(v) & 1u);
      out[k * es + b] = v;
    }
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < block.size[d]) break;
      idx[d] = 0;
    }
  }
}

/// Random cut points splitting `size` into `parts` non-empty pieces (parts <= size).
inline std::vector<std::int64_t> random_cuts(std::mt19937& rng,
                                             std::int64_t size,
                                             std::int64_t parts) {
  std::vector<std::int64_t> all;
  for (std::int64_t i = 1; i < size; ++i) all.push_back(i);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int64_t> cuts{0};
  cuts.insert(cuts.end(), all.begin(), all.begin() + (parts - 1));
  cuts.push_back(size);
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

/// A random block grid over `global` for `ranks` ranks: per-axis cut points whose cell count is
/// at most `ranks`. Cell c goes to rank c; ranks beyond the cell count hold replicas.
struct grid {
  std::vector<std::vector<std::int64_t>> cuts;  // per axis
  std::int64_t cells() const {
    std::int64_t n = 1;
    for (const auto& c : cuts) n *= static_cast<std::int64_t>(c.size()) - 1;
    return n;
  }
  /// The block of cell `c`.
  cairn::box cell(std::int64_t c) const {
    cairn::box b;
    for (std::size_t a = cuts.size(); a-- > 0;) {
      std::int64_t parts = static_cast<std::int64_t>(cuts[a].size()) - 1;
      std::int64_t i = c % parts;
      c /= parts;
      b.offset.insert(b.offset.begin(), cuts[a][i]);
      b.size.insert(b.size.begin(), cuts[a][i + 1] - cuts[a][i]);
    }
    return b;
  }
};

inline grid random_grid(std::mt19937& rng, const cairn::shape& global, int ranks) {
  grid g;
  std::vector<std::int64_t> counts(global.size(), 1);
  std::int64_t remaining = ranks;
  // Multiply random axes while the product stays <= ranks.
  for (int tries = 0; tries < 16 && !global.empty(); ++tries) {
    std::size_t a = rng() % global.size();
    std::int64_t f = 2 + static_cast<std::int64_t>(rng() % 3);
    std::int64_t prod = 1;
    for (auto c : counts) prod *= c;
    if (prod * f <= remaining && counts[a] * f <= global[a]) counts[a] *= f;
  }
  for (std::size_t a = 0; a < global.size(); ++a) {
    if (rng() % 3 == 0) {  // even split when it divides
      std::vector<std::int64_t> c;
      if (global[a] % counts[a] == 0) {
        for (std::int64_t i = 0; i <= counts[a]; ++i) c.push_back(i * (global[a] / counts[a]));
        g.cuts.push_back(c);
        continue;
      }
    }
    g.cuts.push_back(random_cuts(rng, global[a], counts[a]));
  }
  return g;
}

/// Polls `ready` every 100 us, as a training loop polls between steps, until it holds or
/// `limit` has passed; whether it held.
template <class Ready>
bool poll_until(Ready&& ready, std::chrono::milliseconds limit = std::chrono::minutes(1)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

/// Whether a deadline error ("rank(s) 1, 3 did not arrive at ...") names `rank` among the ranks
/// that did not arrive. Tests check membership, not the whole list: on a loaded machine another
/// rank may also be slower to arrive than a short deadline.
inline bool names_missing(const std::string& message, int rank) {
  const auto from = message.find("rank(s) "), to = message.find(" did not arrive");
  if (from == std::string::npos || to == std::string::npos || to < from) return false;
  const std::string named = ", " + message.substr(from + 8, to - from - 8) + ",";
  return named.find(", " + std::to_string(rank) + ",") != std::string::npos;
}

}  // namespace cairn_test
