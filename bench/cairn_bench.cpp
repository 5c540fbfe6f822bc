// cairn-bench: cairn's save and load throughput against the same disk's raw limit, measured
// in the same run.
//
// Each repetition runs, in this order, on the same filesystem and with the same bytes:
//   1. raw write:  one fresh file per rank, `io_threads` threads per rank, 64 MiB pwrite calls,
//                  fdatasync and a directory fsync at the end (the durability cairn's save gives);
//   2. cairn save: `cairn::save` of a block-sharded state_dict on `ranks` thread ranks into a
//                  fresh checkpoint directory (the previous one deleted first);
//   3. raw read:   the raw files read back with 64 MiB preads on the same number of threads,
//                  after dropping them from the page cache;
//   4. cairn load: `cairn::load` into separate buffers, after dropping every checkpoint file
//                  from the page cache.
// Interleaving makes drift of the (virtual) disk affect both sides alike. A first, untimed
// repetition warms up; before each timed phase the page cache is "primed" (see
// prime_free_memory) so that both sides start from the same memory state. Medians over the
// repetitions are reported; the loaded data is checked against the saved data (XXH3 of each
// buffer) and the program exits with status 1 when it differs.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"
#include "metadata_read.hpp"
#include "plan_load.hpp"
#include "plan_real.hpp"
#include "plan_roles.hpp"
#include "plan_sweep.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

constexpr std::uint64_t io_size = std::uint64_t{64} << 20;  // raw I/O call size

const char* const usage_text =
    R"(usage: cairn-bench [options]

Saves and loads a block-sharded state (f32, bf16, f16 and i64 tensors, common values and a
per-rank object) with cairn on in-process thread ranks, interleaved with raw pwrite/pread of
the same bytes on the same filesystem, and reports both and their ratio (medians).

options:
  --bytes SIZE       state size (default 1GiB); SIZE is a number with an optional suffix:
                     KiB MiB GiB TiB (also K M G T) are powers of 1024, kB MB GB TB of 1000
  --ranks N          thread ranks (default 2)
  --io-threads N     cairn's io_threads per rank, and raw I/O threads per rank
                     (default: save_options{}.io_threads)
  --reps N           repetitions, at least 1 (default 3); medians are reported
  --dir DIR          where to create the benchmark's fresh subdirectory (default: the system
                     temporary directory); the subdirectory is removed at the end
  --no-prime         do not prime the page cache before each timed phase (see
                     docs/benchmarks.md: on a VM that returns free memory to its host, the
                     phase that runs second then pays for it)
  --no-tile          save with save_options::tile off (boxes stored row-major, untiled)
  --zstd LEVEL       save with save_options::zstd_level = LEVEL (the data is pseudo-random:
                     nothing shrinks, so this measures compression's cost, its worst case)
  --strategy NAME    save with a strategy: native (default), torch_dist, one_file,
                     per_tensor or chunks (5 GB files); the safetensors ones save the tensors
                     only (they cannot hold the tree's common values and object)
  --plan             instead of I/O: simulate planning for a TP=8 x PP x DP grid of
                     --ranks R ranks and --tensors T weights (metadata only, in one process):
                     what default options do, the save by key owners (as --scalable, every
                     role) and the load of format version 5 (as --load: index reads, load
                     planning, load dedup, the coordinator's commit); below 4 ranks, or with
                     --everywhere, all-gather planning (ranks, tensors, chunks, plan_ms,
                     peak_rss_mb, metadata_bytes); without --ranks/--tensors, a sweep of
                     all-gather planning over R in 8..4096, T in 100..10000
  --tensors T        weights for --plan
  --scalable         with --plan --ranks R --tensors T: the roles of scalable planning (every
                     rank, a sampled key owner, rank 0 as a writer): time and bytes sent and
                     received by each
  --real             with --plan --ranks R --tensors T: run scalable planning for real on R
                     thread ranks and report each rank's time and bytes sent and received
                     (MPI processes: cairn-bench-plan-mpi under mpirun)
  --everywhere       with --plan --real: plan by an all-gather of every rank's description
                     instead (what the default picks for small worlds); with --plan --ranks R
                     --tensors T: simulate that all-gather planning in one process
  --pp P             pipeline stages for --plan --scalable / --real (default min(8, R / 8))
  --owners N         owners sampled by --plan --scalable (default 4)
  --load             with --plan --ranks R --tensors T: format version 5 (index files): the
                     manifest's bytes and decode time, the index bytes, and rank 0's load
                     planning (directories and entries or pages of its tensors), from 300
                     sampled keys
  --balance          with --plan --ranks R --tensors T: the bytes each rank of pipeline stage 0
                     writes when every key of that stage is planned by its owner (key-owner
                     planning, the default): max / mean, and the parts written
  --split-min B      with --balance: save_options::balance_min_bytes (default: the default)
  --metadata         instead of I/O: save --tensors T (default 1000) tensors split by rows over
                     --ranks R thread ranks into memory (format version 5: an index file per
                     key owner), then time read_metadata (median of --reps) through storage
                     whose reads and size calls each wait --latency-us microseconds (default 0)
  --block-size B     checksum block (and tile) size for --reshard (default 1 MiB)
  --v3               save in format version 3 (one metadata.json, no index files) instead of
                     version 4, the default: the I/O bench and --reshard (--index: version 4)
  --reshard          instead of I/O: save tensor-parallel weights (and data-parallel
                     replicas) in memory, load them on 1..8 ranks along both axes, and report
                     bytes read / bytes needed per load and max/mean bytes written per rank
  --async            instead of save/load: async_saver with a warm staging pool; reports
                     stall_ms (until save returns), memcpy_ms (the same bytes copied by the
                     same threads into touched memory), the background persist rate
                     (written and committed) against raw write, and collect_ms (what the
                     training thread spends in wait() once done() is true)
  --json             print one JSON object on stdout instead of a table
  -h, --help         this message

Needs memory for twice the state and about 3.2 times its size free on the disk of DIR.
GB/s means 1e9 bytes per second. Exit status: 0 ok, 1 data mismatch or I/O failure, 2 bad usage.
)";

/// Command-line options.
struct options {
  std::uint64_t bytes = std::uint64_t{1} << 30;
  int ranks = 2;
  int io_threads = cairn::save_options{}.io_threads;
  int reps = 3;
  std::string dir;
  bool prime = true;
  bool tile = true;  ///< save_options::tile
  int zstd = 0;      ///< save_options::zstd_level
  std::string strategy = "native";
  bool json = false;
  bool plan = false;      ///< --plan: the planning simulation instead of I/O
  bool metadata = false;  ///< --metadata: read_metadata of a checkpoint saved by many ranks
  int latency_us = 0;     ///< --latency-us: per storage call, for --metadata
  bool async = false;     ///< --async: async_saver's stall and background persist
  bool reshard = false;   ///< --reshard: read amplification and write balance
  bool ranks_given = false;
  int tensors = 0;          ///< --plan --tensors T
  bool scalable = false;    ///< --plan --scalable: the roles of scalable planning
  bool real = false;        ///< --plan --real: scalable planning on thread ranks
  bool everywhere = false;  ///< --plan --real --everywhere: all-gather planning instead
  int pp = 0;               ///< --pp: pipeline stages of --plan --scalable (0: the default)
  int owners = 4;           ///< --owners: owners sampled by --plan --scalable
  bool load = false;        ///< --plan --load: format version 5 and load planning at scale
  bool balance = false;     ///< --plan --balance: write balance of key-owner planning
  bool sweep = false;       ///< set for the points of the --plan sweep (all-gather planning)
  std::uint64_t split_min = cairn::save_options{}.balance_min_bytes;  ///< --split-min
  std::uint64_t block_size = cairn::default_block_size;               ///< --block-size (--reshard)
  /// --v3 / --index: save in format version 3 or 4 (the default; I/O bench, --reshard)
  bool index_files = cairn::save_options{}.index_files;
};

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses "256MiB", "1GiB", "512MB", "1e9", "4096".
std::uint64_t parse_size(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' ||
                          s[i] == 'e' || s[i] == 'E'))
    ++i;
  std::string num(s.substr(0, i));
  std::string unit(s.substr(i));
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw usage_error("bad size '" + std::string(s) + "'");
  }
  struct unit_def {
    const char* name;
    double mult;
  };
  static constexpr unit_def units[] = {
      {"", 1},         {"B", 1},      {"K", 0x1p10},   {"KiB", 0x1p10},
      {"k", 0x1p10},   {"M", 0x1p20}, {"MiB", 0x1p20}, {"G", 0x1p30},
      {"GiB", 0x1p30}, {"T", 0x1p40}, {"TiB", 0x1p40}, {"kB", 1e3},
      {"KB", 1e3},     {"MB", 1e6},   {"GB", 1e9},     {"TB", 1e12}};
  for (const auto& u : units)
    if (unit == u.name) {
      double b = v * u.mult;
      if (!(b >= 1) || b > 0x1p50) throw usage_error("size out of range: '" + std::string(s) + "'");
      return static_cast<std::uint64_t>(b);
    }
  throw usage_error("unknown size unit '" + unit + "' in '" + std::string(s) + "'");
}

int parse_int(std::string_view s, int lo, const char* what, long hi = 4096) {
  try {
    std::size_t used = 0;
    long v = std::stol(std::string(s), &used);
    if (used != s.size() || v < lo || v > hi) throw std::invalid_argument("");
    return static_cast<int>(v);
  } catch (const std::exception&) {
    throw usage_error(std::string(what) + " needs an integer >= " + std::to_string(lo) + ", got '" +
                      std::string(s) + "'");
  }
}

/// Parses argv; returns nullopt after printing the usage for --help.
std::optional<options> parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw usage_error(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::fputs(usage_text, stdout);
      return std::nullopt;
    } else if (a == "--bytes") {
      o.bytes = parse_size(value());
    } else if (a == "--ranks") {
      o.ranks = parse_int(value(), 1, "--ranks", 1 << 20);
      o.ranks_given = true;
    } else if (a == "--reshard") {
      o.reshard = true;
    } else if (a == "--async") {
      o.async = true;
    } else if (a == "--metadata") {
      o.metadata = true;
    } else if (a == "--latency-us") {
      o.latency_us = parse_int(value(), 0, "--latency-us", 10'000'000);
    } else if (a == "--plan") {
      o.plan = true;
    } else if (a == "--everywhere") {
      o.everywhere = true;
    } else if (a == "--scalable") {
      o.scalable = true;
    } else if (a == "--load") {
      o.load = true;
    } else if (a == "--balance") {
      o.balance = true;
    } else if (a == "--split-min") {
      o.split_min = parse_size(value());
    } else if (a == "--index") {
      o.index_files = true;
    } else if (a == "--v3") {
      o.index_files = false;
    } else if (a == "--block-size") {
      o.block_size = static_cast<std::uint64_t>(
          parse_int(value(), 64, "--block-size", static_cast<int>(cairn::max_block_size)));
    } else if (a == "--real") {
      o.real = true;
    } else if (a == "--pp") {
      o.pp = parse_int(value(), 1, "--pp", 1 << 20);
    } else if (a == "--owners") {
      o.owners = parse_int(value(), 1, "--owners", 1 << 20);
    } else if (a == "--tensors") {
      o.tensors = parse_int(value(), 1, "--tensors", 1 << 24);
    } else if (a == "--io-threads") {
      o.io_threads = parse_int(value(), 1, "--io-threads");
    } else if (a == "--reps") {
      o.reps = parse_int(value(), 1, "--reps");
    } else if (a == "--dir") {
      o.dir = value();
    } else if (a == "--no-prime") {
      o.prime = false;
    } else if (a == "--no-tile") {
      o.tile = false;
    } else if (a == "--zstd") {
      o.zstd = parse_int(value(), 0, "--zstd", 22);
    } else if (a == "--strategy") {
      o.strategy = std::string(value());
      if (auto made = cairn::make_save_strategy(o.strategy); !made)
        throw usage_error("--strategy: " + made.err().message);
    } else if (a == "--json") {
      o.json = true;
    } else {
      throw usage_error("unknown argument '" + std::string(a) + "'");
    }
  }
  return o;
}

/// Page-aligned, pre-touched memory.
struct buffer {
  std::byte* p = nullptr;
  std::size_t n = 0;
  explicit buffer(std::size_t bytes) : n(bytes) {
    p = static_cast<std::byte*>(
        ::operator new (std::max<std::size_t>(n, 1), std::align_val_t{4096}));
    std::memset(p, 0, n);
  }
  buffer(buffer&& o) noexcept : p(std::exchange(o.p, nullptr)), n(o.n) {}
  buffer(const buffer&) = delete;
  ~buffer() {
    if (p) ::operator delete (p, std::align_val_t{4096});
  }
};

/// Fills `b` with a deterministic pseudo-random stream (splitmix64).
void fill_random(buffer& b, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t words = b.n / 8;
  auto* w = reinterpret_cast<std::uint64_t*>(b.p);
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    w[i] = z ^ (z >> 31);
  }
  for (std::size_t i = words * 8; i < b.n; ++i) b.p[i] = static_cast<std::byte>(x >> (i % 8));
}

/// One global tensor of the benchmark state: 2-D, split in row blocks over the ranks.
struct tensor_spec {
  const char* key;
  cairn::dtype type;
  double share;           // of the total bytes
  std::int64_t cols;      // row length in elements
  std::int64_t rows = 0;  // rows per rank (computed)
  std::uint64_t bytes_per_rank() const {
    return static_cast<std::uint64_t>(rows * cols) * cairn::dtype_size(type);
  }
};

/// A model-and-optimizer-like mix of dtypes and sizes; shares sum to 1. Some row lengths are
/// not multiples of 4 KiB, so chunks are not page aligned in the files.
std::vector<tensor_spec> make_specs(std::uint64_t total, int ranks) {
  std::vector<tensor_spec> s = {
      {"model.embed", cairn::dtype::bf16, 0.12, 4096},
      {"model.layers.w_qkv", cairn::dtype::bf16, 0.16, 3072},
      {"model.layers.w_out", cairn::dtype::bf16, 0.06, 1024},
      {"model.layers.w_mlp", cairn::dtype::f16, 0.10, 2816},
      {"model.norm", cairn::dtype::f32, 0.005, 1024},
      {"optim.master", cairn::dtype::f32, 0.17, 2048},
      {"optim.exp_avg", cairn::dtype::f32, 0.17, 2048},
      {"optim.exp_avg_sq", cairn::dtype::f32, 0.17, 2048},
      {"data.sample_ids", cairn::dtype::i64, 0.035, 1000},
      {"data.bias", cairn::dtype::f16, 0.01, 6},
  };
  for (auto& t : s) {
    double row_bytes = static_cast<double>(t.cols) * cairn::dtype_size(t.type) * ranks;
    t.rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(t.share * total / row_bytes));
  }
  return s;
}

template <class T>
cairn::sharded_tensor<T> typed_view(const tensor_spec& t, buffer& b, int rank, int ranks) {
  std::span<T> data(reinterpret_cast<T*>(b.p), b.n / sizeof(T));
  return cairn::from_rank_offsets(t.key, data, {t.rows, t.cols}, {{0, rank, ranks}});
}

/// Adds the sharded tensor of `t` over `b` to `sd`.
void add_tensor(cairn::state_dict& sd, const tensor_spec& t, buffer& b, int rank, int ranks) {
  switch (t.type) {
    case cairn::dtype::f32:
      sd.add(t.key, typed_view<float>(t, b, rank, ranks));
      break;
    case cairn::dtype::bf16:
      sd.add(t.key, typed_view<cairn::bf16>(t, b, rank, ranks));
      break;
    case cairn::dtype::f16:
      sd.add(t.key, typed_view<cairn::f16>(t, b, rank, ranks));
      break;
    case cairn::dtype::i64:
      sd.add(t.key, typed_view<std::int64_t>(t, b, rank, ranks));
      break;
    default:
      throw std::logic_error("unsupported dtype in the benchmark");
  }
}

/// The per-rank RNG-state-like object.
std::vector<std::byte> rng_bytes(int rank) {
  std::vector<std::byte> v(256);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>(rank * 31 + i * 7);
  return v;
}

/// One rank's buffers: what is saved (`src`) and what is loaded into (`dst`).
struct rank_data {
  std::vector<buffer> src, dst;
  std::vector<std::uint64_t> sums;  // XXH3 of each src buffer
  std::uint64_t bytes = 0;
};

/// The state tree of one rank over `bufs`.
cairn::state_dict make_tree(const std::vector<tensor_spec>& specs,
                            std::vector<buffer>& bufs,
                            int rank,
                            int ranks,
                            std::int64_t step,
                            double lr,
                            bool tensors_only = false) {
  cairn::state_dict sd;
  for (std::size_t i = 0; i < specs.size(); ++i) add_tensor(sd, specs[i], bufs[i], rank, ranks);
  if (tensors_only) return sd;  // the safetensors strategies hold tensors only
  sd.add("step", step);
  sd.child("optim").add("lr", lr);
  sd.add("rng", cairn::per_rank("rng", rng_bytes(rank), rank, ranks));
  return sd;
}

/// Throws on a failed POSIX call.
void check_sys(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + ": " + std::strerror(errno));
}

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  check_sys(fd >= 0, "open " + p.string());
  check_sys(::fsync(fd) == 0, "fsync " + p.string());
  ::close(fd);
}

/// Settles earlier writeback of the filesystem holding `p` (outside the timed regions).
void sync_fs(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check_sys(fd >= 0, "open " + p.string());
  ::syncfs(fd);
  ::close(fd);
}

/// Leaves at least `bytes` of just-freed page-cache memory at the head of the kernel's free
/// lists: writes a scratch file of that size in `dir` (no fsync) and deletes it, so its dirty
/// pages are dropped without any disk I/O. The next timed phase then gets memory the guest has
/// just used. Without it, whichever phase runs later after an idle moment gets pages that this
/// VM has already handed back to its host (free page reporting) and pays a host page fault on
/// the first write to each, about 1.5 s of extra CPU per GiB here: an effect of the VM, not of
/// the disk or of cairn, that otherwise lands on whichever side runs second.
void prime_free_memory(const fs::path& dir, std::uint64_t bytes) {
  static const buffer zeros(io_size);
  fs::path p = dir / "prime.scratch";
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check_sys(fd >= 0, "open " + p.string());
  for (std::uint64_t off = 0; off < bytes;) {
    ssize_t k = ::pwrite(fd, zeros.p, io_size, static_cast<off_t>(off));
    if (k < 0 && errno == EINTR) continue;
    check_sys(k > 0, "pwrite " + p.string());
    off += static_cast<std::uint64_t>(k);
  }
  ::unlink(p.c_str());
  ::close(fd);
}

/// Flushes `p` and drops it from the page cache.
void drop_file_cache(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  check_sys(fd >= 0, "open " + p.string());
  check_sys(::fdatasync(fd) == 0, "fdatasync " + p.string());
  int e = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  errno = e;
  check_sys(e == 0, "posix_fadvise " + p.string());
}

/// One raw transfer: `n` bytes between memory at `mem` and the file at `off`.
struct raw_task {
  std::byte* mem;
  std::uint64_t n, off;
};

/// The 64 MiB transfers of one rank's buffers laid end to end in its file.
std::vector<raw_task> raw_tasks(std::vector<buffer>& bufs) {
  std::vector<raw_task> tasks;
  std::uint64_t off = 0;
  for (auto& b : bufs) {
    for (std::uint64_t x = 0; x < b.n; x += io_size)
      tasks.push_back({b.p + x, std::min<std::uint64_t>(io_size, b.n - x), off + x});
    off += b.n;
  }
  return tasks;
}

/// Writes (`write`) or reads each rank's file "raw.<rank>.bin" in `dir` from or into that rank's
/// buffers laid end to end: one thread per rank, each with `threads` I/O threads taking 64 MiB
/// transfers in order, as cairn's ranks do. A write creates a fresh file and ends with
/// fdatasync and a directory fsync.
void raw_io(
    const fs::path& dir, std::vector<rank_data>& ranks, int threads, bool write, bool into_dst) {
  std::vector<std::thread> rank_threads;
  std::vector<std::string> errors(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    rank_threads.emplace_back([&, r] {
      try {
        fs::path p = dir / ("raw." + std::to_string(r) + ".bin");
        int fd;
        if (write) {
          ::unlink(p.c_str());
          fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        } else {
          fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
        }
        check_sys(fd >= 0, "open " + p.string());
        auto tasks = raw_tasks(into_dst ? ranks[r].dst : ranks[r].src);
        std::atomic<std::size_t> next{0};
        std::atomic<bool> failed{false};
        auto worker = [&] {
          for (std::size_t i; !failed && (i = next++) < tasks.size();) {
            const raw_task& t = tasks[i];
            for (std::uint64_t done = 0; done < t.n;) {
              ssize_t k = write ? ::pwrite(fd, t.mem + done, t.n - done, t.off + done)
                                : ::pread(fd, t.mem + done, t.n - done, t.off + done);
              if (k < 0 && errno == EINTR) continue;
              if (k <= 0) {
                failed = true;
                return;
              }
              done += static_cast<std::uint64_t>(k);
            }
          }
        };
        std::vector<std::thread> pool;
        for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
        worker();
        for (auto& t : pool) t.join();
        if (failed) throw std::runtime_error((write ? "pwrite " : "pread ") + p.string());
        if (write) check_sys(::fdatasync(fd) == 0, "fdatasync " + p.string());
        check_sys(::close(fd) == 0, "close " + p.string());
        if (write) fsync_path(dir, true);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : rank_threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// CPU seconds (user + system) this process has used so far.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

/// The median of `v` (mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// Times of one repetition, in seconds.
struct rep_times {
  double raw_write, save, raw_read, load;
  double raw_write_cpu, save_cpu, raw_read_cpu, load_cpu;  // CPU seconds of all threads
};

/// A fresh directory removed (with everything in it) at scope exit.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const fs::path& parent) {
    fs::create_directories(parent);
    std::string tmpl = (parent / "cairn-bench-XXXXXX").string();
    check_sys(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp " + tmpl);
    path = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Checks that every dst buffer equals its src buffer; returns the number of mismatches.
int count_mismatches(const std::vector<rank_data>& ranks) {
  int bad = 0;
  for (const auto& rd : ranks)
    for (std::size_t i = 0; i < rd.dst.size(); ++i)
      if (cairn::checksum({rd.dst[i].p, rd.dst[i].n}) != rd.sums[i]) ++bad;
  return bad;
}

/// `s` with JSON string escapes.
std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else
      out += c;
  }
  return out;
}

void clear_dst(std::vector<rank_data>& ranks) {
  for (auto& rd : ranks)
    for (auto& b : rd.dst) std::memset(b.p, 0xA5, b.n);
}

int run(const options& o) {
  const fs::path parent = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
  const std::int64_t step = 123456;
  const double lr = 3e-4;

  // The state: per rank, one src and one dst buffer per tensor, pre-touched.
  auto specs = make_specs(o.bytes, o.ranks);
  std::vector<rank_data> ranks(static_cast<std::size_t>(o.ranks));
  std::uint64_t total = 0;
  {
    std::vector<std::thread> fillers;
    for (int r = 0; r < o.ranks; ++r) {
      auto& rd = ranks[static_cast<std::size_t>(r)];
      for (const auto& t : specs) {
        rd.src.emplace_back(t.bytes_per_rank());
        rd.dst.emplace_back(t.bytes_per_rank());
        rd.bytes += t.bytes_per_rank();
      }
      total += rd.bytes;
      fillers.emplace_back([&rd, r] {
        for (std::size_t i = 0; i < rd.src.size(); ++i) {
          fill_random(rd.src[i], static_cast<std::uint64_t>(r) * 1000 + i);
          rd.sums.push_back(cairn::checksum({rd.src[i].p, rd.src[i].n}));
        }
      });
    }
    for (auto& t : fillers) t.join();
  }

  scratch_dir root(parent);
  const fs::path raw_dir = root.path / "raw";
  fs::create_directories(raw_dir);
  std::vector<rep_times> times;
  cairn::load_stats load_total;
  std::uint64_t bytes_written = 0;
  std::uint64_t stored_bytes = 0;  ///< bytes of every file of the checkpoint
  // The writer registered under the format id (cairn/strategies.hpp registers them all).
  const std::unique_ptr<cairn::save_strategy> writer =
      cairn::make_save_strategy(o.strategy).value();
  const bool tensors_only = o.strategy != "native" && o.strategy != "torch_dist";
  const cairn::save_strategy* strategy = writer.get();
  int mismatches = 0;
  bool objects_ok = true, commons_ok = true;

  const std::uint64_t prime_bytes = o.prime ? total + total / 8 + (std::uint64_t{64} << 20) : 0;
  auto raw_file = [&](int r) { return raw_dir / ("raw." + std::to_string(r) + ".bin"); };
  // Repetition 0 is a warm-up whose times are not kept: after it, every timed phase starts
  // right after the page cache of the previous files is freed (see docs/benchmarks.md).
  for (int rep = 0; rep <= o.reps; ++rep) {
    rep_times t{};
    const fs::path ckpt = root.path / ("ckpt-" + std::to_string(rep));
    const fs::path prev_ckpt = root.path / ("ckpt-" + std::to_string(rep - 1));

    // 1. Raw write, into fresh files (the previous ones deleted first).
    for (int r = 0; r < o.ranks; ++r) ::unlink(raw_file(r).c_str());
    sync_fs(root.path);
    prime_free_memory(root.path, prime_bytes);
    double c0 = cpu_seconds();
    auto t0 = clock_type::now();
    raw_io(raw_dir, ranks, o.io_threads, /*write=*/true, /*into_dst=*/false);
    t.raw_write = seconds_since(t0);
    t.raw_write_cpu = cpu_seconds() - c0;

    // 2. cairn save, into a fresh directory (the previous checkpoint deleted first).
    fs::remove_all(prev_ckpt);
    sync_fs(root.path);
    prime_free_memory(root.path, prime_bytes);
    std::vector<cairn::save_stats> ss(ranks.size());
    c0 = cpu_seconds();
    t0 = clock_type::now();
    cairn::run_ranks(o.ranks, [&](cairn::thread_communicator& comm) {
      const int r = comm.rank();
      auto& rd = ranks[static_cast<std::size_t>(r)];
      cairn::state_dict sd = make_tree(specs, rd.src, r, o.ranks, step, lr, tensors_only);
      cairn::file_storage disk(ckpt);
      cairn::save_options so;
      so.io_threads = o.io_threads;
      so.tile = o.tile;
      so.zstd_level = o.zstd;
      so.index_files = o.index_files;
      so.strategy = strategy;
      ss[static_cast<std::size_t>(r)] = cairn::save(sd, disk, comm, so);
    });
    t.save = seconds_since(t0);
    t.save_cpu = cpu_seconds() - c0;
    bytes_written = 0;
    for (const auto& s : ss) bytes_written += s.bytes_written;
    stored_bytes = 0;
    for (const auto& e : fs::directory_iterator(ckpt))
      if (e.is_regular_file()) stored_bytes += e.file_size();

    // 3. Raw read, with the raw files dropped from the page cache.
    clear_dst(ranks);
    for (int r = 0; r < o.ranks; ++r) drop_file_cache(raw_file(r));
    sync_fs(root.path);
    prime_free_memory(root.path, prime_bytes);
    c0 = cpu_seconds();
    t0 = clock_type::now();
    raw_io(raw_dir, ranks, o.io_threads, /*write=*/false, /*into_dst=*/true);
    t.raw_read = seconds_since(t0);
    t.raw_read_cpu = cpu_seconds() - c0;
    if (int bad = count_mismatches(ranks)) {
      std::fprintf(stderr, "cairn-bench: raw read returned wrong data in %d buffers\n", bad);
      return 1;
    }

    // 4. cairn load, with every file of the checkpoint dropped from the page cache.
    clear_dst(ranks);
    std::vector<cairn::load_stats> ls(ranks.size());
    std::vector<cairn::state_dict> trees(ranks.size());
    for (int r = 0; r < o.ranks; ++r) {
      auto ur = static_cast<std::size_t>(r);
      trees[ur] = make_tree(specs, ranks[ur].dst, r, o.ranks, 0, 0.0, tensors_only);
      // Clobber the object; load must restore it (and the common values, 0 here).
      if (!tensors_only)
        std::get<cairn::byte_object>(*trees[ur].find("rng")).value.assign(256, std::byte{0});
    }
    cairn::file_storage(ckpt).drop_caches().value();
    sync_fs(root.path);
    prime_free_memory(root.path, prime_bytes);
    c0 = cpu_seconds();
    t0 = clock_type::now();
    cairn::run_ranks(o.ranks, [&](cairn::thread_communicator& comm) {
      auto r = static_cast<std::size_t>(comm.rank());
      cairn::file_storage disk(ckpt);
      cairn::load_options lo;
      lo.io_threads = o.io_threads;
      ls[r] = cairn::load(trees[r], disk, comm, lo);
    });
    t.load = seconds_since(t0);
    t.load_cpu = cpu_seconds() - c0;
    load_total = {};
    for (const auto& s : ls) {
      load_total.bytes_read += s.bytes_read;
      load_total.bytes_needed += s.bytes_needed;
    }
    mismatches += count_mismatches(ranks);
    for (int r = 0; r < o.ranks && !tensors_only; ++r) {
      auto& sd = trees[static_cast<std::size_t>(r)];
      objects_ok &= std::get<cairn::byte_object>(*sd.find("rng")).value == rng_bytes(r);
      auto& s = std::get<cairn::common_value>(*sd.find("step"));
      auto& l = std::get<cairn::common_value>(*sd.child("optim").find("lr"));
      commons_ok &= s.data == cairn::common_value::of(step).data &&
                    l.data == cairn::common_value::of(lr).data;
    }
    if (rep > 0) times.push_back(t);
  }

  auto med = [&](double rep_times::*m) {
    std::vector<double> v;
    for (const auto& t : times) v.push_back(t.*m);
    return median(v);
  };
  // The fastest repetition of each phase: this VM's noise only ever adds time, so best-of ratios
  // are a steadier second view than medians of 3.
  auto best = [&](double rep_times::*m) {
    double b = times.front().*m;
    for (const auto& t : times) b = std::min(b, t.*m);
    return b;
  };
  const double gb = static_cast<double>(total) / 1e9;
  const double raw_write = gb / med(&rep_times::raw_write), save = gb / med(&rep_times::save);
  const double raw_read = gb / med(&rep_times::raw_read), load = gb / med(&rep_times::load);
  const double best_save_ratio = best(&rep_times::raw_write) / best(&rep_times::save);
  const double best_load_ratio = best(&rep_times::raw_read) / best(&rep_times::load);
  const bool valid = mismatches == 0 && objects_ok && commons_ok;

  if (o.json) {
    std::string per_rep;
    for (std::size_t i = 0; i < times.size(); ++i) {
      const auto& t = times[i];
      per_rep += fmt::format(
          "{}{{\"raw_write_s\":{:.4f},\"save_s\":{:.4f},\"raw_read_s\":{:.4f},\"load_s\":{:.4f},"
          "\"raw_write_cpu_s\":{:.4f},\"save_cpu_s\":{:.4f},\"raw_read_cpu_s\":{:.4f},"
          "\"load_cpu_s\":{:.4f}}}",
          i ? "," : "", t.raw_write, t.save, t.raw_read, t.load, t.raw_write_cpu, t.save_cpu,
          t.raw_read_cpu, t.load_cpu);
    }
    fmt::print(
        "{{\"bench\":\"cairn-bench\",\"bytes\":{},\"bytes_requested\":{},\"ranks\":{},\"io_"
        "threads\":{},\"reps\":{},"
        "\"tensors\":{},\"dir\":\"{}\",\"save_gbps\":{:.4f},\"raw_write_gbps\":{:.4f},"
        "\"load_gbps\":{:.4f},\"raw_read_gbps\":{:.4f},\"save_ratio\":{:.4f},"
        "\"load_ratio\":{:.4f},\"best_save_ratio\":{:.4f},\"best_load_ratio\":{:.4f},"
        "\"strategy\":\"{}\",\"zstd_level\":{},\"stored_bytes\":{},"
        "\"bytes_written\":{},\"bytes_read\":{},\"bytes_needed\":{},"
        "\"valid\":{},\"primed\":{},\"warmup_reps\":1,\"per_rep\":[{}]}}\n",
        total, o.bytes, o.ranks, o.io_threads, o.reps, specs.size(), json_escape(parent.string()),
        save, raw_write, load, raw_read, save / raw_write, load / raw_read, best_save_ratio,
        best_load_ratio, o.strategy, o.zstd, stored_bytes, bytes_written, load_total.bytes_read,
        load_total.bytes_needed, valid, o.prime, per_rep);
  } else {
    fmt::print(
        "cairn-bench: {} bytes ({:.3f} GiB) in {} tensors x {} ranks, io_threads {}, {} reps\n",
        total, static_cast<double>(total) / 0x1p30, specs.size(), o.ranks, o.io_threads, o.reps);
    fmt::print("directory: {} (a fresh subdirectory, removed at the end)\n\n", parent.string());
    fmt::print("{:<12} {:>10} {:>9} {:>10} {:>10}\n", "", "median s", "GB/s", "vs. raw", "best-of");
    fmt::print("{:<12} {:>10.3f} {:>9.3f}\n", "raw write", med(&rep_times::raw_write), raw_write);
    fmt::print("{:<12} {:>10.3f} {:>9.3f} {:>9.2f}x {:>9.2f}x\n", "cairn save",
               med(&rep_times::save), save, save / raw_write, best_save_ratio);
    fmt::print("{:<12} {:>10.3f} {:>9.3f}\n", "raw read", med(&rep_times::raw_read), raw_read);
    fmt::print("{:<12} {:>10.3f} {:>9.3f} {:>9.2f}x {:>9.2f}x\n\n", "cairn load",
               med(&rep_times::load), load, load / raw_read, best_load_ratio);
    fmt::print("per repetition, wall s (CPU s of all threads):\n");
    fmt::print("  rep      raw write          save       raw read          load\n");
    for (std::size_t i = 0; i < times.size(); ++i) {
      const auto& t = times[i];
      fmt::print(
          "  {:>3} {:>6.3f} ({:>5.2f}) {:>6.3f} ({:>5.2f}) {:>6.3f} ({:>5.2f}) {:>6.3f} "
          "({:>5.2f})\n",
          i + 1, t.raw_write, t.raw_write_cpu, t.save, t.save_cpu, t.raw_read, t.raw_read_cpu,
          t.load, t.load_cpu);
    }
    fmt::print(
        "\nstrategy {}, zstd level {}: cairn wrote {} bytes of data into {} bytes of files\n",
        o.strategy, o.zstd, bytes_written, stored_bytes);
    fmt::print("load read {} bytes for {} needed; data {}\n", load_total.bytes_read,
               load_total.bytes_needed, valid ? "verified" : "MISMATCH");
  }
  if (!valid) {
    std::fprintf(stderr,
                 "cairn-bench: loaded state differs from the saved one (%d tensor buffers, "
                 "objects %s, common values %s)\n",
                 mismatches, objects_ok ? "ok" : "wrong", commons_ok ? "ok" : "wrong");
    return 1;
  }
  return 0;
}

}  // namespace

/// `--reshard`: read amplification of loads on other topologies, and the write balance of
/// replicated state. In memory (memory_storage): only the byte counters matter here.
int run_reshard(const options& o) {
  using cairn::shape;
  struct weight {
    const char* key;
    int axis;  // the tensor-parallel axis (0: column-parallel, 1: row-parallel)
  };
  const weight weights[] = {{"w_qkv", 0}, {"w_out", 1}};
  const std::int64_t n = 2048;  // [2048, 2048] bf16 = 8 MiB each
  auto make = [&](cairn::state_dict& sd, std::vector<std::vector<cairn::bf16>>& bufs, int tp,
                  int tp_rank, int replica) {
    bufs.resize(std::size(weights));
    for (std::size_t i = 0; i < std::size(weights); ++i) {
      shape local{n, n};
      local[static_cast<std::size_t>(weights[i].axis)] = n / tp;
      bufs[i].assign(static_cast<std::size_t>(local[0] * local[1]), cairn::bf16{});
      for (std::size_t k = 0; k < bufs[i].size(); ++k)
        bufs[i][k].bits = static_cast<std::uint16_t>(k * 2654435761u >> 7);
      sd.add(weights[i].key, cairn::from_rank_offsets(weights[i].key, std::span(bufs[i]), local,
                                                      {{weights[i].axis, tp_rank, tp}}, replica));
    }
  };
  auto max_over_mean = [](const std::vector<std::uint64_t>& v) {
    double sum = 0, mx = 0;
    for (auto x : v) sum += static_cast<double>(x), mx = std::max(mx, static_cast<double>(x));
    return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 0.0;
  };
  cairn::save_options so;
  so.tile = o.tile;
  so.block_size = o.block_size;
  so.index_files = o.index_files;
  // 1. Balance: TP=2 x DP=2 and TP=1 x DP=4 (every rank holds every byte).
  struct balance_point {
    int tp, dp;
    double ratio;
  };
  std::vector<balance_point> balance;
  cairn::memory_storage saved;  // the TP=4 checkpoint the loads below read
  for (auto [tp_, dp] : {std::pair{4, 1}, std::pair{2, 2}, std::pair{1, 4}}) {
    const int tp = tp_;  // a lambda may not capture a structured binding before clang 16
    cairn::memory_storage mem;
    std::vector<std::uint64_t> per_rank;
    cairn::run_ranks(tp * dp, [&](cairn::thread_communicator& comm) {
      cairn::state_dict sd;
      std::vector<std::vector<cairn::bf16>> bufs;
      make(sd, bufs, tp, comm.rank() % tp, comm.rank() / tp);
      auto st = cairn::save(sd, tp == 4 ? static_cast<cairn::storage_ref>(saved) : mem, comm, so);
      if (comm.rank() == 0) per_rank = st.bytes_per_rank;
    });
    balance.push_back({tp, dp, max_over_mean(per_rank)});
  }
  // 2. Read amplification: the TP=4 checkpoint loaded with TP = M along the same axes.
  struct amp_point {
    int ranks;
    double worst;
    std::uint64_t read, needed;
  };
  std::vector<amp_point> amp;
  for (int m : {1, 2, 3, 4, 6, 8}) {
    std::vector<cairn::load_stats> ls(static_cast<std::size_t>(m));
    bool ok = true;
    cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
      cairn::state_dict sd;
      std::vector<std::vector<cairn::bf16>> bufs;
      // Uneven splits (3, 6) get the remainder on the last rank.
      bufs.resize(std::size(weights));
      for (std::size_t i = 0; i < std::size(weights); ++i) {
        std::int64_t lo = n * comm.rank() / m, hi = n * (comm.rank() + 1) / m;
        shape local{n, n}, off{0, 0};
        local[static_cast<std::size_t>(weights[i].axis)] = hi - lo;
        off[static_cast<std::size_t>(weights[i].axis)] = lo;
        bufs[i].assign(static_cast<std::size_t>(local[0] * local[1]), cairn::bf16{});
        sd.add(weights[i].key,
               cairn::block(weights[i].key, std::span(bufs[i]), local, {n, n}, off));
      }
      auto r = cairn::try_load(sd, saved, comm);
      if (!r)
        ok = false;
      else
        ls[static_cast<std::size_t>(comm.rank())] = *r;
    });
    if (!ok) {
      std::fprintf(stderr, "cairn-bench: reshard load on %d ranks failed\n", m);
      return 1;
    }
    amp_point p{m, 0, 0, 0};
    for (const auto& s : ls) {
      p.worst = std::max(p.worst,
                         static_cast<double>(s.bytes_read) / static_cast<double>(s.bytes_needed));
      p.read += s.bytes_read;
      p.needed += s.bytes_needed;
    }
    amp.push_back(p);
  }
  if (o.json) {
    std::string b, a;
    for (std::size_t i = 0; i < balance.size(); ++i)
      b += fmt::format("{}{{\"tp\":{},\"dp\":{},\"max_over_mean\":{:.4f}}}", i ? "," : "",
                       balance[i].tp, balance[i].dp, balance[i].ratio);
    for (std::size_t i = 0; i < amp.size(); ++i)
      a += fmt::format(
          "{}{{\"from_tp\":4,\"to_tp\":{},\"worst_read_over_needed\":{:.4f},"
          "\"total_read_over_needed\":{:.4f}}}",
          i ? "," : "", amp[i].ranks, amp[i].worst,
          static_cast<double>(amp[i].read) / static_cast<double>(amp[i].needed));
    fmt::print(
        "{{\"bench\":\"cairn-reshard\",\"tiled\":{},\"block_size\":{},\"index_files\":{},"
        "\"balance\":[{}],\"read_amplification\":[{}]}}\n",
        o.tile, o.block_size, o.index_files, b, a);
  } else {
    fmt::print("write balance (max / mean bytes per rank):\n");
    for (const auto& p : balance) fmt::print("  TP={} x DP={}: {:.3f}\n", p.tp, p.dp, p.ratio);
    fmt::print("read amplification, TP=4 checkpoint loaded with TP=M (worst rank, all ranks):\n");
    for (const auto& p : amp)
      fmt::print("  M={}: {:.3f}  {:.3f}\n", p.ranks, p.worst,
                 static_cast<double>(p.read) / static_cast<double>(p.needed));
  }
  return 0;
}

/// `--async`: the stall of `async_saver::save` with a warm pool, against memcpy of the same
/// bytes on the same threads, and the background persist against raw writes.
int run_async(const options& o) {
  const fs::path parent = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
  auto specs = make_specs(o.bytes, o.ranks);
  std::vector<rank_data> ranks(static_cast<std::size_t>(o.ranks));
  std::uint64_t total = 0;
  for (int r = 0; r < o.ranks; ++r) {
    auto& rd = ranks[static_cast<std::size_t>(r)];
    for (const auto& t : specs) {
      rd.src.emplace_back(t.bytes_per_rank());
      rd.dst.emplace_back(t.bytes_per_rank());  // memcpy target, touched
      rd.bytes += t.bytes_per_rank();
    }
    for (std::size_t i = 0; i < rd.src.size(); ++i) fill_random(rd.src[i], r * 1000 + i);
    total += rd.bytes;
  }
  scratch_dir root(parent);
  const fs::path raw_dir = root.path / "raw";
  fs::create_directories(raw_dir);
  const int staging_threads = cairn::async_saver_options{}.staging_threads;

  std::vector<std::unique_ptr<cairn::async_saver>> savers;
  std::vector<cairn::save_plan_cache> caches(ranks.size());
  std::vector<cairn::state_dict> trees;
  for (int r = 0; r < o.ranks; ++r) {
    savers.push_back(std::make_unique<cairn::async_saver>());
    trees.push_back(make_tree(specs, ranks[static_cast<std::size_t>(r)].src, r, o.ranks, 1, 0.1));
  }
  struct rep_result {
    double raw_write_s, memcpy_ms, stall_ms, stage_ms, persist_s, collect_ms;
  };
  std::vector<rep_result> reps;
  bool plan_reused = true;
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms the pool and the plan cache
    rep_result x{};
    for (int r = 0; r < o.ranks; ++r)
      ::unlink((raw_dir / ("raw." + std::to_string(r) + ".bin")).c_str());
    sync_fs(root.path);
    auto t0 = clock_type::now();
    raw_io(raw_dir, ranks, o.io_threads, /*write=*/true, /*into_dst=*/false);
    x.raw_write_s = seconds_since(t0);

    // memcpy of every rank's bytes into touched memory, `staging_threads` threads per rank,
    // all ranks at once (as the ranks stage at once).
    t0 = clock_type::now();
    {
      std::vector<std::thread> th;
      for (auto& rd : ranks)
        for (int k = 0; k < staging_threads; ++k)
          th.emplace_back([&rd, k, staging_threads] {
            for (std::size_t i = 0; i < rd.src.size(); ++i) {
              std::size_t n = rd.src[i].n, per = (n + staging_threads - 1) / staging_threads;
              std::size_t a = std::min(n, per * k), b = std::min(n, a + per);
              std::memcpy(rd.dst[i].p + a, rd.src[i].p + a, b - a);
            }
          });
      for (auto& t : th) t.join();
    }
    x.memcpy_ms = seconds_since(t0) * 1e3;

    const fs::path ckpt = root.path / ("ckpt-" + std::to_string(rep));
    fs::remove_all(root.path / ("ckpt-" + std::to_string(rep - 1)));
    sync_fs(root.path);
    std::vector<double> stall(ranks.size()), stage(ranks.size()), persist(ranks.size()),
        collect(ranks.size());
    std::atomic<bool> failed{false};
    cairn::run_ranks(o.ranks, [&](cairn::thread_communicator& comm) {
      auto r = static_cast<std::size_t>(comm.rank());
      cairn::file_storage disk(ckpt);
      cairn::save_options so;
      so.io_threads = o.io_threads;
      so.tile = o.tile;
      so.plan_cache = &caches[r];
      auto s0 = clock_type::now();
      auto h = savers[r]->save(trees[r], disk, comm, so);
      auto s1 = clock_type::now();
      if (!h) {
        failed = true;
        return;
      }
      stall[r] = std::chrono::duration<double, std::milli>(s1 - s0).count();
      stage[r] = h->started().stage_ms;
      if (rep > 0 && !h->started().plan_reused) plan_reused = false;
      // Poll as a training loop would between steps: the background thread writes and
      // commits; then the call that collects the result is the training thread's only other
      // cost (the whole commit, where nothing commits in the background).
      if (savers[r]->commits_in_background())
        while (!h->done()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      auto c0 = clock_type::now();
      auto w = h->wait();
      if (!w) failed = true;
      collect[r] = seconds_since(c0) * 1e3;
      persist[r] = seconds_since(s1);
    });
    if (failed) {
      std::fprintf(stderr, "cairn-bench: async save failed\n");
      return 1;
    }
    x.stall_ms = *std::max_element(stall.begin(), stall.end());
    x.stage_ms = *std::max_element(stage.begin(), stage.end());
    x.persist_s = *std::max_element(persist.begin(), persist.end());
    x.collect_ms = *std::max_element(collect.begin(), collect.end());
    if (rep > 0) reps.push_back(x);
  }
  auto med = [&](double rep_result::*m) {
    std::vector<double> v;
    for (const auto& r : reps) v.push_back(r.*m);
    return median(v);
  };
  const double gb = static_cast<double>(total) / 1e9;
  const double stall = med(&rep_result::stall_ms), memcpy_ms = med(&rep_result::memcpy_ms);
  const double raw = gb / med(&rep_result::raw_write_s), persist = gb / med(&rep_result::persist_s);
  std::string per_rep;
  for (std::size_t i = 0; i < reps.size(); ++i)
    per_rep += fmt::format(
        "{}{{\"raw_write_s\":{:.4f},\"memcpy_ms\":{:.2f},\"stall_ms\":{:.2f},"
        "\"stage_ms\":{:.2f},\"persist_s\":{:.4f},\"collect_ms\":{:.3f}}}",
        i ? "," : "", reps[i].raw_write_s, reps[i].memcpy_ms, reps[i].stall_ms, reps[i].stage_ms,
        reps[i].persist_s, reps[i].collect_ms);
  if (o.json) {
    fmt::print(
        "{{\"bench\":\"cairn-async\",\"bytes\":{},\"ranks\":{},\"io_threads\":{},"
        "\"staging_threads\":{},\"reps\":{},\"stall_ms\":{:.2f},\"memcpy_ms\":{:.2f},"
        "\"stall_ratio\":{:.3f},\"persist_gbps\":{:.4f},\"raw_write_gbps\":{:.4f},"
        "\"persist_ratio\":{:.4f},\"collect_ms\":{:.3f},\"background_commit\":{},"
        "\"plan_reused\":{},\"pinned\":{},\"per_rep\":[{}]}}\n",
        total, o.ranks, o.io_threads, staging_threads, o.reps, stall, memcpy_ms, stall / memcpy_ms,
        persist, raw, persist / raw, med(&rep_result::collect_ms),
        savers[0]->commits_in_background(), plan_reused, savers[0]->pool().pinned(), per_rep);
  } else {
    fmt::print("cairn-bench --async: {} bytes x {} ranks, staging threads {}, {} reps\n", total,
               o.ranks, staging_threads, o.reps);
    fmt::print(
        "stall (until save returns)  {:8.2f} ms   memcpy of the same bytes {:8.2f} ms   "
        "ratio {:.2f}\n",
        stall, memcpy_ms, stall / memcpy_ms);
    fmt::print(
        "background persist          {:8.3f} GB/s raw write                {:8.3f} GB/s  "
        "ratio {:.2f}\n",
        persist, raw, persist / raw);
    fmt::print("collecting the result (wait) {:8.3f} ms   commit in the background: {}\n",
               med(&rep_result::collect_ms), savers[0]->commits_in_background());
  }
  return 0;
}

/// One planning point in a child process, so that its peak resident memory is its own.
std::optional<std::string> plan_point_in_child(int ranks, int tensors, const options& o) {
  int fd[2];
  if (::pipe(fd) != 0) return std::nullopt;
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    ::close(fd[0]);
    // One point without a mode flag measures what default options do: key-owner planning
    // (every role) and the load of format version 5, from key_owner_planning_min_ranks up.
    const bool defaults = !o.load && !o.balance && !o.scalable && !o.everywhere && !o.sweep &&
                          ranks >= cairn::detail::key_owner_planning_min_ranks;
    std::string j = o.load      ? cairn_bench::simulate_load(ranks, tensors, o.pp, 300)
                    : o.balance ? cairn_bench::simulate_balance(ranks, tensors, o.pp, o.split_min)
                    : o.scalable || defaults
                        ? cairn_bench::simulate_roles(ranks, tensors, o.pp, o.owners)
                        : cairn_bench::plan_point_json(cairn_bench::simulate_plan(ranks, tensors));
    if (defaults)
      j = fmt::format("{{\"defaults\":true,\"save\":{},\"load\":{}}}", j,
                      cairn_bench::simulate_load(ranks, tensors, o.pp, 300));
    ssize_t w = ::write(fd[1], j.data(), j.size());
    ::_exit(w == static_cast<ssize_t>(j.size()) ? 0 : 1);
  }
  ::close(fd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty()) return std::nullopt;
  return out;
}

/// `--plan --real`: scalable planning on thread ranks, every rank's figures.
int run_plan_real(const options& o) {
  cairn_bench::grid g = cairn_bench::make_grid(o.ranks, o.tensors, o.pp);
  std::vector<cairn_bench::real_rank> figures(static_cast<std::size_t>(o.ranks));
  cairn::run_ranks(o.ranks, [&](cairn::thread_communicator& c) {
    figures[static_cast<std::size_t>(c.rank())] = cairn_bench::plan_for_real(c, g, o.everywhere);
  });
  std::printf("%s\n", cairn_bench::real_json(
                          g, figures,
                          o.everywhere ? "thread ranks, all-gather" : "thread ranks, key owners")
                          .c_str());
  return 0;
}

/// `--plan`: one point (--ranks and --tensors) or the sweep.
int run_plan(const options& o) {
  if (o.real) {
    if (!o.ranks_given || o.tensors <= 0)
      throw usage_error("--plan --real takes --ranks and --tensors");
    return run_plan_real(o);
  }
  if (o.ranks_given != (o.tensors > 0))
    throw usage_error("--plan takes both --ranks and --tensors, or neither (the sweep)");
  if (o.tensors > 0) {
    auto j = plan_point_in_child(o.ranks, o.tensors, o);
    if (!j) {
      std::fprintf(stderr, "cairn-bench: the planning run failed (out of memory?)\n");
      return 1;
    }
    if (o.json) {
      std::printf("%s\n", j->c_str());
    } else {
      std::printf("planning %d ranks x %d tensors: %s\n", o.ranks, o.tensors, j->c_str());
    }
    return 0;
  }
  // The sweep (of all-gather planning). Cost grows with ranks x tensors (every rank's description
  // of every tensor it holds reaches every rank); points beyond the cap would take minutes and tens
  // of GiB.
  constexpr double cap = 6e6;
  std::vector<std::string> points, skipped;
  for (int r : {8, 64, 512, 4096})
    for (int t : {100, 1000, 10000}) {
      if (!o.scalable && !o.load && !o.balance && static_cast<double>(r) * t > cap) {
        skipped.push_back(fmt::format(
            "{{\"ranks\":{},\"tensors\":{},\"reason\":\"ranks x tensors = {} > {:.0f}: "
            "minutes and tens of GiB with one metadata.json (see docs/benchmarks.md)\"}}",
            r, t, static_cast<long long>(r) * t, cap));
        if (!o.json)
          std::printf("%5d ranks x %5d tensors: skipped (ranks x tensors > %.0f)\n", r, t, cap);
        continue;
      }
      options swept = o;
      swept.sweep = true;
      auto j = plan_point_in_child(r, t, swept);
      if (!j) {
        std::fprintf(stderr, "cairn-bench: planning %d x %d failed\n", r, t);
        return 1;
      }
      points.push_back(*j);
      if (!o.json) std::printf("%5d ranks x %5d tensors: %s\n", r, t, j->c_str());
    }
  if (o.json) {
    std::string out = "{\"bench\":\"cairn-plan\",\"points\":[";
    for (std::size_t i = 0; i < points.size(); ++i) out += (i ? "," : "") + points[i];
    out += "],\"skipped\":[";
    for (std::size_t i = 0; i < skipped.size(); ++i) out += (i ? "," : "") + skipped[i];
    out += "]}";
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    auto o = parse_args(argc, argv);
    if (!o) return 0;
    if (o->plan) return run_plan(*o);
    if (o->metadata) {
      std::printf("%s\n", cairn_bench::simulate_metadata_read(
                              o->ranks, o->tensors ? o->tensors : 1000, o->latency_us, o->reps)
                              .c_str());
      return 0;
    }
    if (o->async) return run_async(*o);
    if (o->reshard) return run_reshard(*o);
    if (o->tensors) throw usage_error("--tensors goes with --plan");
    return run(*o);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "cairn-bench: %s\n\n%s", e.what(), usage_text);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn-bench: %s\n", e.what());
    return 1;
  }
}
