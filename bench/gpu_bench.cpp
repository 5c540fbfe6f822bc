// bench/gpu_bench.cpp: cairn's device paths on a real GPU against the machine's own limits,
// measured in the same run (docs/benchmarks.md, "GPU").
//
//   cairn-gpu-bench [--bytes 4GiB] [--tensors 32] [--reps 3] [--io-threads N] [--dir DIR] [--json]
//
// The state is `--tensors` float tensors in device memory, `--bytes` in all, each filled with
// its own pattern. Limits: cudaMemcpyAsync device-to-host into pinned memory (one stream, every
// tensor), host-to-device back, device-to-host into pageable memory, and a plain write + fsync
// of the same bytes from pinned memory into DIR. cairn: the stager (staging_pool + stager, the
// copy an async save stalls training for), a synchronous `save` of the device tensors, an
// `async_saver` save (stall: what training waits for; persist: the background write), and a
// `load` back into zeroed device tensors (checked against the patterns). Times are the median
// of `--reps` repetitions after one warm-up. Exits 77 (skipped) without a usable device.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cairn/cairn.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(
        fmt::format("{}: {} (code {})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct options {
  std::uint64_t bytes = 4ull << 30;
  int tensors = 32;
  int reps = 3;
  int io_threads = cairn::save_options{}.io_threads;  ///< save's and load's io_threads
  fs::path dir = fs::temp_directory_path() / "cairn-gpu-bench";
  bool json = false;
};

/// Byte j of tensor k's pattern.
unsigned char pattern_byte(int k, std::size_t j) {
  return static_cast<unsigned char>((j * 131u + static_cast<std::size_t>(k) * 7919u) >> 3);
}

/// Writes `n` bytes at `p` into `path` and fsyncs it.
void write_file(const fs::path& path, const std::byte* p, std::size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("open " + path.string() + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, p + done, std::min<std::size_t>(n - done, 64u << 20),
                         static_cast<off_t>(done));
    if (w <= 0) throw std::runtime_error("write " + path.string() + ": " + std::strerror(errno));
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync " + path.string());
  ::close(fd);
}

void fsync_dir(const fs::path& d) {
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

struct result_row {
  std::string name;
  double seconds = 0;
  double bytes = 0;
  double vs = 0;  ///< ratio to the limit named in `vs_name` (0: none)
  std::string vs_name;
};

int run(const options& o) {
  const auto& dev = cairn::cuda::system_device();
  if (!dev.usable) {
    std::printf("SKIP: no usable CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::size_t per = (o.bytes / static_cast<std::uint64_t>(o.tensors)) & ~std::size_t{4095};
  const std::size_t total = per * static_cast<std::size_t>(o.tensors);
  const std::size_t floats = per / sizeof(float);

  // The device state and its patterns.
  std::vector<float*> dev_src(static_cast<std::size_t>(o.tensors)), dev_dst(dev_src.size());
  {
    std::vector<unsigned char> host(per);
    for (int k = 0; k < o.tensors; ++k) {
      for (std::size_t j = 0; j < per; ++j) host[j] = pattern_byte(k, j);
      auto uk = static_cast<std::size_t>(k);
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&dev_src[uk]), per), "cudaMalloc");
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&dev_dst[uk]), per), "cudaMalloc");
      check_cuda(cudaMemcpy(dev_src[uk], host.data(), per, cudaMemcpyHostToDevice), "upload");
    }
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::byte* pinned = nullptr;
  auto t_pin = clock_type::now();
  check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total, cudaHostAllocPortable),
             "cudaHostAlloc");
  const double pin_s = seconds_since(t_pin);
  std::vector<std::byte> pageable(total, std::byte{1});  // touched

  std::vector<result_row> rows;
  // A row of `seconds` for all bytes, with its ratio to `limit_s`, the time the machine's limit
  // `limit_name` took for them (none when 0).
  auto record = [&](const std::string& name, double seconds, double limit_s = 0,
                    const std::string& limit_name = "") {
    rows.push_back({name, seconds, static_cast<double>(total), limit_s > 0 ? limit_s / seconds : 0,
                    limit_name});
    return seconds;
  };
  // Records the median of `body(rep)` over `o.reps` repetitions after a warm-up (rep 0).
  auto timed = [&](const std::string& name, auto&& body, double limit_s = 0,
                   const std::string& limit_name = "") {
    std::vector<double> t;
    for (int rep = 0; rep <= o.reps; ++rep) {
      double s = body(rep);
      if (rep > 0) t.push_back(s);
    }
    return record(name, median(t), limit_s, limit_name);
  };
  // An empty directory for one repetition's checkpoint.
  auto fresh_dir = [&](const std::string& kind, int rep) {
    fs::path d = o.dir / (kind + "-" + std::to_string(rep));
    fs::remove_all(d);
    return d;
  };
  auto copy_all = [&](std::byte* host, bool to_host) {
    auto t0 = clock_type::now();
    for (int k = 0; k < o.tensors; ++k) {
      auto uk = static_cast<std::size_t>(k);
      std::byte* h = host + uk * per;
      check_cuda(to_host ? cudaMemcpyAsync(h, dev_src[uk], per, cudaMemcpyDeviceToHost, stream)
                         : cudaMemcpyAsync(dev_dst[uk], h, per, cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync");
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return seconds_since(t0);
  };

  // Limits.
  const double d2h = timed("limit: D2H into pinned (cudaMemcpyAsync)",
                           [&](int) { return copy_all(pinned, true); });
  const double h2d = timed("limit: H2D from pinned (cudaMemcpyAsync)",
                           [&](int) { return copy_all(pinned, false); });
  timed("limit: D2H into pageable", [&](int) { return copy_all(pageable.data(), true); });
  fs::remove_all(o.dir);
  fs::create_directories(o.dir);
  const double raw_write = timed("limit: write + fsync from pinned", [&](int rep) {
    fs::path raw = o.dir / ("raw-" + std::to_string(rep));
    fs::create_directories(raw);
    auto t0 = clock_type::now();
    std::vector<std::thread> th;
    for (int k = 0; k < o.tensors; ++k)
      th.emplace_back([&, k] {
        auto uk = static_cast<std::size_t>(k);
        write_file(raw / (std::to_string(k) + ".bin"), pinned + uk * per, per);
      });
    for (auto& t : th) t.join();
    fsync_dir(raw);
    double s = seconds_since(t0);
    fs::remove_all(raw);
    return s;
  });

  // The state tree over the device tensors.
  auto tree_of = [&](std::vector<float*>& ptrs) {
    cairn::state_dict sd;
    for (int k = 0; k < o.tensors; ++k) {
      auto uk = static_cast<std::size_t>(k);
      const auto n = static_cast<std::int64_t>(floats);
      sd.add("layers." + std::to_string(k) + ".weight",
             cairn::block<float>("layers." + std::to_string(k) + ".weight",
                                 std::span(ptrs[uk], floats), {n}, {n}, {0}));
    }
    return sd;
  };
  cairn::state_dict src_tree = tree_of(dev_src);

  // cairn: the stager alone.
  cairn::cuda::staging_pool pool;
  {
    cairn::cuda::stager st(pool);
    std::vector<cairn::cuda::stage_item> items;
    for (int k = 0; k < o.tensors; ++k)
      items.push_back({dev_src[static_cast<std::size_t>(k)], per, "t"});
    timed(
        "cairn stager: stage + wait",
        [&](int) {
          pool.reset();
          auto t0 = clock_type::now();
          st.stage(items).value();
          st.wait().value();
          return seconds_since(t0);
        },
        d2h, "D2H pinned");
    pool.reset();
  }
  const std::string pool_kind = pool.describe();

  cairn::single_communicator comm;
  // cairn: synchronous save of the device tensors.
  cairn::save_options so;
  so.io_threads = o.io_threads;
  timed(
      "cairn save (sync, device tensors)",
      [&](int rep) {
        fs::path ckpt = fresh_dir("sync", rep);
        cairn::file_storage disk(ckpt);
        cairn::save_options sync = so;
        sync.staging = &pool;
        auto t0 = clock_type::now();
        cairn::save(src_tree, disk, comm, sync);
        double s = seconds_since(t0);
        if (rep < o.reps) fs::remove_all(ckpt);  // the last one is loaded below
        return s;
      },
      d2h + raw_write, "D2H + write");

  // cairn: async save; stall is what training waits for.
  std::vector<double> stall, persist;
  {
    cairn::async_saver saver({.staging = &pool});
    cairn::save_plan_cache cache;
    cairn::save_options cached = so;
    cached.plan_cache = &cache;
    for (int rep = 0; rep <= o.reps; ++rep) {
      fs::path ckpt = fresh_dir("async", rep);
      cairn::file_storage disk(ckpt);
      auto t0 = clock_type::now();
      auto h = saver.save(src_tree, disk, comm, cached).value();
      double st = seconds_since(t0);
      auto t1 = clock_type::now();
      h.wait().value();
      double pt = seconds_since(t1);
      if (rep > 0) stall.push_back(st), persist.push_back(pt);
      fs::remove_all(ckpt);
    }
  }
  record("cairn async save: stall", median(stall), d2h, "D2H pinned");
  record("cairn async save: background persist", median(persist), raw_write, "write + fsync");

  // cairn: load back into zeroed device tensors, checked.
  fs::path loaded_from = o.dir / ("sync-" + std::to_string(o.reps));
  bool data_ok = true;
  timed(
      "cairn load (into device tensors)",
      [&](int) {
        for (auto* p : dev_dst) check_cuda(cudaMemset(p, 0, per), "cudaMemset");
        check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        cairn::state_dict dst_tree = tree_of(dev_dst);
        cairn::file_storage disk(loaded_from);
        disk.drop_caches().value();
        cairn::load_options lo;
        lo.staging = &pool;
        lo.io_threads = o.io_threads;
        auto t0 = clock_type::now();
        cairn::load(dst_tree, disk, comm, lo);
        double s = seconds_since(t0);
        std::vector<unsigned char> got(per);
        for (int k = 0; k < o.tensors; ++k) {
          check_cuda(cudaMemcpy(got.data(), dev_dst[static_cast<std::size_t>(k)], per,
                                cudaMemcpyDeviceToHost),
                     "download");
          for (std::size_t j = 0; j < per; j += 4093)
            data_ok = data_ok && got[j] == pattern_byte(k, j);
          data_ok = data_ok && got[per - 1] == pattern_byte(k, per - 1);
        }
        return s;
      },
      h2d, "H2D pinned");

  if (o.json) {
    fmt::print(
        "{{\"device\":\"{}\",\"bytes\":{},\"tensors\":{},\"reps\":{},\"pool\":\"{}\","
        "\"io_threads\":{},\"pin_s\":{:.3f},\"data_ok\":{},\"rows\":[",
        prop.name, total, o.tensors, o.reps, pool_kind, o.io_threads, pin_s, data_ok);
    for (std::size_t i = 0; i < rows.size(); ++i)
      fmt::print(
          "{}{{\"name\":\"{}\",\"s\":{:.5f},\"GBps\":{:.2f},\"vs\":{:.3f},\"vs_name\":\"{}\"}}",
          i ? "," : "", rows[i].name, rows[i].seconds, rows[i].bytes / rows[i].seconds / 1e9,
          rows[i].vs, rows[i].vs_name);
    fmt::print("]}}\n");
  }
  fmt::print("cairn-gpu-bench: {} ({} SMs), {} bytes in {} device tensors, median of {} reps\n",
             prop.name, prop.multiProcessorCount, total, o.tensors, o.reps);
  fmt::print("staging pool: {}; pinning {} bytes took {:.2f} s; io_threads {}; dir {}\n", pool_kind,
             total, pin_s, o.io_threads, o.dir.string());
  fmt::print("{:<44} {:>10} {:>9} {:>7}  {}\n", "what", "ms", "GB/s", "ratio", "to");
  for (const auto& r : rows)
    fmt::print("{:<44} {:>10.1f} {:>9.2f} {:>7}  {}\n", r.name, r.seconds * 1e3,
               r.bytes / r.seconds / 1e9, r.vs > 0 ? fmt::format("{:.2f}", r.vs) : "", r.vs_name);
  fmt::print("load data: {}\n", data_ok ? "match" : "MISMATCH");

  for (auto* p : dev_src) cudaFree(p);
  for (auto* p : dev_dst) cudaFree(p);
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
  fs::remove_all(o.dir);
  return data_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--bytes") {
        std::string v = value();
        std::uint64_t mult = 1;
        if (v.ends_with("GiB"))
          mult = 1ull << 30, v.resize(v.size() - 3);
        else if (v.ends_with("MiB"))
          mult = 1ull << 20, v.resize(v.size() - 3);
        o.bytes = std::stoull(v) * mult;
      } else if (a == "--tensors") {
        o.tensors = std::stoi(value());
      } else if (a == "--reps") {
        o.reps = std::stoi(value());
      } else if (a == "--io-threads") {
        o.io_threads = std::stoi(value());
      } else if (a == "--dir") {
        o.dir = value();
      } else if (a == "--json") {
        o.json = true;
      } else {
        std::fprintf(stderr,
                     "usage: cairn-gpu-bench [--bytes 4GiB] [--tensors 32] [--reps 3] "
                     "[--io-threads N] [--dir DIR] [--json]\n");
        return 2;
      }
    }
    if (o.tensors < 1 || o.reps < 1 || o.io_threads < 1 ||
        o.bytes < static_cast<std::uint64_t>(o.tensors) * 4096)
      throw std::invalid_argument("--tensors and --reps must be >= 1, --bytes >= 4 KiB per tensor");
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn-gpu-bench: %s\n", e.what());
    return 1;
  }
}
