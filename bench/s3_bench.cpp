// cairn-s3-bench: save and load throughput through s3_storage against an S3-compatible server,
// next to raw PUT/GET of the same bytes through the same backend.
//
//   AWS_ENDPOINT_URL=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x
//   cairn-s3-bench s3://bucket/prefix [--mib 256] [--ranks 4] [--reps 3]
//
// Ranks are threads (thread_communicator); each rank holds a row block of one f32 tensor.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/s3.hpp"

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: cairn-s3-bench s3://bucket/prefix [--mib N] [--ranks N] [--reps N]\n");
    return 2;
  }
  std::string uri = argv[1];
  std::int64_t mib = 256;
  int ranks = 4, reps = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib") mib = std::atoll(argv[i + 1]);
    if (a == "--ranks") ranks = std::atoi(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const std::int64_t cols = 1024, rows = mib * (1 << 20) / 4 / cols;
  const double bytes = static_cast<double>(rows * cols * 4);
  cairn::s3_storage st(uri + "/bench-ckpt");
  cairn::s3_storage raw(uri + "/bench-raw");
  std::printf("cairn-s3-bench: %s, %lld MiB, %d ranks (threads), best of %d\n", uri.c_str(),
              static_cast<long long>(mib), ranks, reps);
  std::vector<std::vector<float>> data(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::int64_t lo = rows * r / ranks, hi = rows * (r + 1) / ranks;
    data[r].assign(static_cast<std::size_t>((hi - lo) * cols), static_cast<float>(r));
  }
  auto make_sd = [&](int r, std::vector<float>& buf) {
    std::int64_t lo = rows * r / ranks, hi = rows * (r + 1) / ranks;
    cairn::sharded_tensor<> t;
    t.key = "w";
    t.type = cairn::dtype::f32;
    t.local_shape = {hi - lo, cols};
    t.global_shape = {rows, cols};
    t.global_offset = {lo, 0};
    t.data = std::as_writable_bytes(std::span(buf));
    cairn::state_dict sd;
    sd.add("w", t);
    return sd;
  };
  double best_save = 1e9, best_load = 1e9, best_put = 1e9, best_get = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    cairn::save_options so;
    so.overwrite = true;
    so.io_threads = 4;
    double t0 = now();
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      auto sd = make_sd(comm.rank(), data[comm.rank()]);
      cairn::save(sd, st, comm, so);
    });
    best_save = std::min(best_save, now() - t0);
    cairn::load_options lo;
    lo.io_threads = 4;
    t0 = now();
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      std::vector<float> buf(data[comm.rank()].size());
      auto sd = make_sd(comm.rank(), buf);
      cairn::load(sd, st, comm, lo);
    });
    best_load = std::min(best_load, now() - t0);
    // Raw: each rank PUTs (multipart writer, 4 threads) and GETs its bytes, no cairn format.
    t0 = now();
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      auto b = std::as_bytes(std::span(data[comm.rank()]));
      auto w = raw.open_writer("r" + std::to_string(comm.rank()));
      std::vector<std::thread> th;
      for (int k = 0; k < 4; ++k)
        th.emplace_back([&, k] {
          std::size_t lo2 = b.size() * k / 4, hi2 = b.size() * (k + 1) / 4;
          (void)(*w)->write_at(lo2, b.subspan(lo2, hi2 - lo2));
        });
      for (auto& t : th) t.join();
      (*w)->finish().value();
    });
    best_put = std::min(best_put, now() - t0);
    t0 = now();
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      std::vector<std::byte> buf(data[comm.rank()].size() * 4);
      std::vector<std::thread> th;
      for (int k = 0; k < 4; ++k)
        th.emplace_back([&, k] {
          std::size_t lo2 = buf.size() * k / 4, hi2 = buf.size() * (k + 1) / 4;
          raw.read("r" + std::to_string(comm.rank()), lo2, std::span(buf).subspan(lo2, hi2 - lo2))
              .value();
        });
      for (auto& t : th) t.join();
    });
    best_get = std::min(best_get, now() - t0);
  }
  auto mbps = [&](double s) { return bytes / s / 1e6; };
  std::printf("save  %7.3f s  %7.1f MB/s\n", best_save, mbps(best_save));
  std::printf("load  %7.3f s  %7.1f MB/s\n", best_load, mbps(best_load));
  std::printf("raw PUT (multipart, same bytes)  %7.3f s  %7.1f MB/s\n", best_put, mbps(best_put));
  std::printf("raw GET (ranged, same bytes)     %7.3f s  %7.1f MB/s\n", best_get, mbps(best_get));
  auto c = st.counters();
  std::printf("checkpoint storage: %llu requests, %llu retries, %llu parts, %llu GETs\n",
              static_cast<unsigned long long>(c.requests),
              static_cast<unsigned long long>(c.retries), static_cast<unsigned long long>(c.parts),
              static_cast<unsigned long long>(c.gets));
  return 0;
}
