// cairn-torch-bench: saving and loading the GPT reference trainer's state (examples/gpt: model
// and AdamW moments, fp32) through cairn against torch::save / torch::load of the same tensors,
// and against the disk's raw limit, in the same run on the same filesystem.
//
//   cairn-torch-bench [--layers 8] [--width 512] [--reps 3] [--dir DIR] [--json]
//
// One repetition, in this order (so drift of the disk hits every side alike):
//   raw write    the state's bytes with 64 MiB pwrite calls into io_threads files on as many
//                threads (cairn's default, 2), then fdatasync
//   torch::save  an OutputArchive of every tensor by name, saved to one file, then fdatasync
//                (torch::save does not sync; without it the page cache would hide the disk)
//   cairn save   cairn::save of module_state + optimizer_state on one rank (fsyncs itself)
//   raw read     the raw files dropped from the page cache, read back with 64 MiB preads
//   torch::load  its file dropped from the page cache, torch::load of every tensor by name
//   cairn load   its files dropped from the page cache, cairn::load in place into the tensors
// Medians of the timed repetitions after an untimed warm-up; each load is checked against a
// checksum of what was saved (exit status 1 on a difference).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/comm/mpi.hpp"
#include "cairn/libtorch.hpp"
#include "examples/gpt/model.hpp"

namespace fs = std::filesystem;

namespace {

constexpr std::size_t io_size = std::size_t{64} << 20;

void check_sys(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + ": " + std::strerror(errno));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Flushes `p` to the disk and drops it from the page cache.
void sync_and_drop(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  check_sys(fd >= 0, "open " + p.string());
  check_sys(::fdatasync(fd) == 0, "fdatasync " + p.string());
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// Writes (or reads) `n` bytes of `mem` to (from) `p` in 64 MiB calls; a write ends synced.
void raw_file(const fs::path& p, std::byte* mem, std::size_t n, bool write) {
  int fd = ::open(p.c_str(),
                  write ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0644);
  check_sys(fd >= 0, "open " + p.string());
  for (std::size_t off = 0; off < n;) {
    std::size_t len = std::min(io_size, n - off);
    ssize_t k = write ? ::pwrite(fd, mem + off, len, static_cast<off_t>(off))
                      : ::pread(fd, mem + off, len, static_cast<off_t>(off));
    if (k < 0 && errno == EINTR) continue;
    check_sys(k > 0, (write ? "pwrite " : "pread ") + p.string());
    off += static_cast<std::size_t>(k);
  }
  if (write) check_sys(::fdatasync(fd) == 0, "fdatasync " + p.string());
  ::close(fd);
}

/// The raw limit: `n` bytes of `mem` in `threads` files `<p>.<i>` of equal parts, one thread
/// each (cairn's save and load use `io_threads` = 2 writer and reader threads by default).
void raw_transfer(const fs::path& p, std::byte* mem, std::size_t n, bool write, int threads) {
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      std::size_t b = n * static_cast<std::size_t>(i) / static_cast<std::size_t>(threads);
      std::size_t e = n * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(threads);
      try {
        raw_file(p.string() + "." + std::to_string(i), mem + b, e - b, write);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// A checksum of every tensor (their sum of squares, in double) to check loads with.
double checksum(const std::vector<cairn::libtorch::named_tensor>& ts) {
  double s = 0;
  for (const auto& t : ts) s += t.tensor.to(torch::kDouble).pow(2).sum().item<double>();
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  gpt::config c;
  c.layers = 8;
  c.width = 512;
  c.vocab = 8192;
  c.context = 256;
  int reps = 3;
  const int io_threads = cairn::save_options{}.io_threads;
  bool json = false;
  fs::path base = fs::temp_directory_path();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--layers")
      c.layers = std::stoll(next());
    else if (a == "--width")
      c.width = std::stoll(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--dir")
      base = next();
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr,
                   "usage: cairn-torch-bench [--layers N] [--width N] [--reps N] "
                   "[--dir DIR] [--json]\n");
      return 2;
    }
  }
  cairn::mpi_environment env(argc, argv);
  torch::manual_seed(0);
  gpt::tp_group solo_tp;
  gpt::model net(c, solo_tp);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-4));
  {  // one step so that the moments exist and hold non-zero values
    net->zero_grad();
    auto idx = torch::randint(c.vocab, {2, 16});
    net->forward(idx).pow(2).mean().backward();
    opt.step();
  }
  // Everything saved: the parameters and both moments of every parameter.
  std::vector<cairn::libtorch::named_tensor> all;
  for (auto& p : net->named_parameters()) {
    all.push_back({"model." + p.key(), p.value(), {}});
    auto& s = static_cast<torch::optim::AdamWParamState&>(
        *opt.state()[cairn::libtorch::optimizer_state_key(p.value())]);
    all.push_back({"optim.state." + p.key() + ".exp_avg", s.exp_avg(), {}});
    all.push_back({"optim.state." + p.key() + ".exp_avg_sq", s.exp_avg_sq(), {}});
  }
  std::size_t bytes = 0;
  for (auto& t : all) bytes += t.tensor.nbytes();
  const double want = checksum(all);

  cairn::single_communicator comm;
  cairn::state_dict sd;
  sd.add("model", cairn::libtorch::module_state(*net));
  sd.add("optim", cairn::libtorch::optimizer_state(opt, *net));

  fs::path dir = base / ("cairn-torch-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::byte> raw(bytes);
  std::vector<double> t_raw_w, t_torch_w, t_cairn_w, t_raw_r, t_torch_r, t_cairn_r;
  bool ok = true;
  for (int rep = 0; rep <= reps; ++rep) {
    const bool timed = rep > 0;
    // Every side writes fresh files: the previous repetition's are deleted untimed.
    for (int i = 0; i < io_threads; ++i) fs::remove(dir / ("raw.bin." + std::to_string(i)));
    fs::remove(dir / "state.pt");
    fs::remove_all(dir / "ckpt");
    ::sync();
    auto t0 = std::chrono::steady_clock::now();
    raw_transfer(dir / "raw.bin", raw.data(), bytes, true, io_threads);
    double raw_w = seconds_since(t0);

    fs::path pt = dir / "state.pt";
    t0 = std::chrono::steady_clock::now();
    {
      torch::serialize::OutputArchive archive;
      for (auto& t : all) archive.write(t.name, t.tensor);
      archive.save_to(pt.string());
    }
    sync_and_drop(pt);
    double torch_w = seconds_since(t0);

    cairn::file_storage disk(dir / "ckpt");
    t0 = std::chrono::steady_clock::now();
    auto saved = cairn::save(sd, disk, comm);
    double cairn_w = seconds_since(t0);
    ok = ok && saved.bytes_written >= bytes;

    for (int i = 0; i < io_threads; ++i) sync_and_drop(dir / ("raw.bin." + std::to_string(i)));
    t0 = std::chrono::steady_clock::now();
    raw_transfer(dir / "raw.bin", raw.data(), bytes, false, io_threads);
    double raw_r = seconds_since(t0);

    // torch::load replaces each tensor's storage with the one it read (Tensor::set_).
    sync_and_drop(pt);
    t0 = std::chrono::steady_clock::now();
    {
      torch::serialize::InputArchive archive;
      archive.load_from(pt.string());
      for (auto& t : all) archive.read(t.name, t.tensor);
    }
    double torch_r = seconds_since(t0);
    ok = ok && checksum(all) == want;

    // cairn loads in place: zero the tensors first so the check sees what the load wrote.
    {
      torch::NoGradGuard no_grad;
      for (auto& t : all) t.tensor.zero_();
    }
    disk.drop_caches().value();
    t0 = std::chrono::steady_clock::now();
    cairn::load(sd, disk, comm);
    double cairn_r = seconds_since(t0);
    ok = ok && checksum(all) == want;
    if (!timed) continue;
    t_raw_w.push_back(raw_w), t_torch_w.push_back(torch_w), t_cairn_w.push_back(cairn_w);
    t_raw_r.push_back(raw_r), t_torch_r.push_back(torch_r), t_cairn_r.push_back(cairn_r);
  }
  fs::remove_all(dir);
  auto gbps = [&](double s) { return static_cast<double>(bytes) / s / 1e9; };
  double rw = median(t_raw_w), tw = median(t_torch_w), cw = median(t_cairn_w);
  double rr = median(t_raw_r), tr = median(t_torch_r), cr = median(t_cairn_r);
  if (json) {
    std::printf(
        "{\"bytes\":%zu,\"tensors\":%zu,\"reps\":%d,"
        "\"raw_write_gbps\":%.3f,\"torch_save_gbps\":%.3f,\"cairn_save_gbps\":%.3f,"
        "\"raw_read_gbps\":%.3f,\"torch_load_gbps\":%.3f,\"cairn_load_gbps\":%.3f,"
        "\"verified\":%s}\n",
        bytes, all.size(), reps, gbps(rw), gbps(tw), gbps(cw), gbps(rr), gbps(tr), gbps(cr),
        ok ? "true" : "false");
  } else {
    std::printf("GPT state: %zu tensors, %.1f MB (model %lld layers x %lld wide + AdamW moments)\n",
                all.size(), static_cast<double>(bytes) / 1e6, static_cast<long long>(c.layers),
                static_cast<long long>(c.width));
    std::printf("%-12s %8s %8s %10s\n", "", "seconds", "GB/s", "of raw");
    auto row = [&](const char* name, double s, double limit) {
      std::printf("%-12s %8.3f %8.3f %9.0f%%\n", name, s, gbps(s), 100 * limit / s);
    };
    row("raw write", rw, rw);
    row("torch::save", tw, rw);
    row("cairn save", cw, rw);
    row("raw read", rr, rr);
    row("torch::load", tr, rr);
    row("cairn load", cr, rr);
    std::printf("loads verified: %s\n", ok ? "yes" : "NO");
  }
  return ok ? 0 : 1;
}
