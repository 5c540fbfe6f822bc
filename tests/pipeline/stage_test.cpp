// Synchronous save and load of tensors that live in (fake) device memory: bytes go through
// pinned staging memory with cudaMemcpyAsync, never touched by host code directly.
#include <doctest/doctest.h>

#include <cstring>

#include "cairn/cairn.hpp"
#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/testing/fake_runtime.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/test_util.hpp"

using cairn::cuda::testing::fake_runtime;

TEST_CASE("device tensors: save and load through staging memory (fake device)") {
  fake_runtime fake;
  const cairn::shape global{64, 48};
  cairn::memory_storage mem;
  // Save on 2 ranks from device memory (row blocks).
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::box b{{32 * comm.rank(), 0}, {32, 48}};
    std::vector<std::byte> host(32 * 48 * 4);
    cairn_test::fill_block("w", cairn::dtype::f32, global, b, host.data());
    void* dev = fake.device_malloc(host.size());
    fake.device_write(dev, host.data(), host.size());
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(static_cast<float*>(dev), 32 * 48),
                                         {32, 48}, {{0, comm.rank(), 2}}));
    cairn::save_options so;
    so.cuda_runtime = &fake.api();
    so.block_size = 1024;  // tiled: the gather reads the staged copy, not device memory
    cairn::save(sd, mem, comm, so);
    fake.device_free(dev);
  });
  // Load on 3 ranks into device memory (column blocks, uneven), and on 1 rank into host memory.
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::int64_t lo = 48 * comm.rank() / 3, hi = 48 * (comm.rank() + 1) / 3;
    cairn::box b{{0, lo}, {64, hi - lo}};
    std::size_t bytes = static_cast<std::size_t>(b.volume()) * 4;
    void* dev = fake.device_malloc(bytes);
    cairn::state_dict sd;
    sd.add("w", cairn::block("w", std::span(static_cast<float*>(dev), bytes / 4), b.size, global,
                             b.offset));
    cairn::load_options lo_opt;
    lo_opt.cuda_runtime = &fake.api();
    cairn::load(sd, mem, comm, lo_opt);
    std::vector<std::byte> want(bytes);
    cairn_test::fill_block("w", cairn::dtype::f32, global, b, want.data());
    CHECK(fake.device_read(dev, bytes) == want);
    fake.device_free(dev);
  });
  std::vector<float> whole(64 * 48);
  cairn::single_communicator one;
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(whole), global, 0));
  cairn::load(sd, mem, one);
  std::vector<std::byte> want(whole.size() * 4);
  cairn_test::fill_block("w", cairn::dtype::f32, global, cairn::box{{0, 0}, global}, want.data());
  CHECK(std::memcmp(want.data(), whole.data(), want.size()) == 0);
  CHECK(fake.misuse().empty());
  for (const auto& m : fake.misuse()) MESSAGE(m);
}

namespace {

/// One [256, 64] f32 tensor in (fake) device memory, a staging pool, and save and load options
/// that stage through the pool.
struct pooled_device_state {
  fake_runtime fake;
  cairn::cuda::staging_pool pool{{}, &fake.api()};
  std::vector<std::byte> host = std::vector<std::byte>(256 * 64 * 4);
  void* dev = nullptr;
  cairn::state_dict sd;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save_options so;
  cairn::load_options lo;

  pooled_device_state() {
    const cairn::shape global{256, 64};
    cairn_test::fill_block("w", cairn::dtype::f32, global, cairn::box{{0, 0}, global}, host.data());
    dev = fake.device_malloc(host.size());
    fake.device_write(dev, host.data(), host.size());
    sd.add("w", cairn::replicated("w", std::span(static_cast<float*>(dev), 256 * 64), global, 0));
    so.cuda_runtime = &fake.api();
    so.staging = &pool;
    so.overwrite = true;
    lo.cuda_runtime = &fake.api();
    lo.staging = &pool;
  }
  ~pooled_device_state() { fake.device_free(dev); }
};

}  // namespace

TEST_CASE("device tensors: repeated saves and loads through one staging pool allocate it once") {
  pooled_device_state t;
  auto& [fake, pool, host, dev, sd, mem, one, so, lo] = t;
  const int allocs_before = fake.stats().host_allocs;
  for (int i = 0; i < 3; ++i) {
    cairn::save(sd, mem, one, so);
    CHECK(pool.used() == 0);  // released after every call, for the next one
    cairn::load(sd, mem, one, lo);
  }
  CHECK(pool.allocations() == 1);
  CHECK(fake.stats().host_allocs - allocs_before == 1);
  CHECK(fake.device_read(dev, host.size()) == host);
  // Without a pool in the options, every call allocates its own.
  so.staging = nullptr;
  cairn::save(sd, mem, one, so);
  cairn::save(sd, mem, one, so);
  CHECK(fake.stats().host_allocs - allocs_before == 3);
  // A pool still in use (an async save through it in flight) is refused, not overwritten.
  (void)pool.acquire(64).value();
  so.staging = &pool;
  auto busy = cairn::try_save(sd, mem, one, so);
  REQUIRE(!busy);
  CHECK(busy.err().code == cairn::errc::invalid_argument);
  CHECK(busy.err().message.find("staging pool is in use") != std::string::npos);
  pool.reset();
  CHECK(fake.misuse().empty());
}

TEST_CASE("device tensors: async_saver, save and load share one staging pool, allocated once") {
  pooled_device_state t;
  auto& [fake, pool, host, dev, sd, mem, one, so, lo] = t;
  cairn::async_saver_options ao;
  ao.runtime = &fake.api();
  ao.staging = &pool;
  cairn::async_saver saver(ao);
  CHECK(&saver.pool() == &pool);
  const int allocs_before = fake.stats().host_allocs;
  for (int i = 0; i < 2; ++i) {
    auto h = saver.save(sd, mem, one, so);
    REQUIRE(h);
    // In flight, the staged bytes are the saver's: a synchronous save through the pool is
    // refused, not allowed to overwrite them.
    auto busy = cairn::try_save(sd, mem, one, so);
    REQUIRE(!busy);
    CHECK(busy.err().code == cairn::errc::invalid_argument);
    REQUIRE(h->wait());
    cairn::save(sd, mem, one, so);
    cairn::load(sd, mem, one, lo);
  }
  CHECK(pool.allocations() == 1);
  CHECK(fake.stats().host_allocs - allocs_before == 1);
  CHECK(fake.device_read(dev, host.size()) == host);
  CHECK(fake.misuse().empty());
}

namespace {

/// Two f32 tensors in (fake) device memory on one rank, 20 MiB in all: `w` [2048, 1024] (tiled
/// into 1 MiB tiles by default) and `v` [3, 1 Mi] (rows of 4 MiB).
struct big_device_state {
  fake_runtime fake;
  const cairn::shape w_shape{2048, 1024}, v_shape{3, 1 << 20};
  std::vector<std::byte> w_host, v_host;
  void *w_dev = nullptr, *v_dev = nullptr;
  cairn::state_dict sd;

  big_device_state() {
    w_host = filled("w", w_shape);
    v_host = filled("v", v_shape);
    w_dev = on_device(w_host);
    v_dev = on_device(v_host);
    sd.add("w", cairn::replicated("w", std::span(static_cast<float*>(w_dev), w_host.size() / 4),
                                  w_shape, 0));
    sd.add("v", cairn::replicated("v", std::span(static_cast<float*>(v_dev), v_host.size() / 4),
                                  v_shape, 0));
  }
  ~big_device_state() {
    fake.device_free(w_dev);
    fake.device_free(v_dev);
  }
  static std::vector<std::byte> filled(const std::string& key, const cairn::shape& s) {
    std::vector<std::byte> b(static_cast<std::size_t>(s[0] * s[1]) * 4);
    cairn_test::fill_block(key, cairn::dtype::f32, s, cairn::box{{0, 0}, s}, b.data());
    return b;
  }
  void* on_device(const std::vector<std::byte>& host) {
    void* p = fake.device_malloc(host.size());
    fake.device_write(p, host.data(), host.size());
    return p;
  }
  /// Loads the checkpoint in `st` into host memory on one rank: true when both tensors match.
  bool loads_back(cairn::storage_ref st) const {
    std::vector<float> w(w_host.size() / 4), v(v_host.size() / 4);
    cairn::state_dict host;
    host.add("w", cairn::replicated("w", std::span(w), w_shape, 0));
    host.add("v", cairn::replicated("v", std::span(v), v_shape, 0));
    cairn::single_communicator one;
    cairn::load(host, st, one);
    return std::memcmp(w.data(), w_host.data(), w_host.size()) == 0 &&
           std::memcmp(v.data(), v_host.data(), v_host.size()) == 0;
  }
};

}  // namespace

TEST_CASE("device tensors: a synchronous save stages at most its window, in every strategy") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
  struct variant {
    const char* name;
    const cairn::save_strategy* strategy;
    bool tile;
    int zstd;
    bool index_files = true;
  };
  // Format version 3 tiles along every axis (tiles gathered from device memory run by run);
  // version 4 cuts row slabs.
  const variant variants[] = {{"native, tiled", nullptr, true, 0},
                              {"native v3, tiled", nullptr, true, 0, false},
                              {"native, untiled, zstd", nullptr, false, 3},
                              {"native v3, tiled, zstd", nullptr, true, 3, false},
                              {"torch_dist", &torch_dist, false, 0},
                              {"safetensors", &one_file, false, 0}};
  const std::size_t window = std::size_t{2} << 20;
  for (const variant& v : variants) {
    CAPTURE(v.name);
    big_device_state t;
    cairn::memory_storage mem;
    cairn::single_communicator one;
    cairn::save_options so;
    so.cuda_runtime = &t.fake.api();
    so.strategy = v.strategy;
    so.tile = v.tile;
    so.zstd_level = v.zstd;
    so.index_files = v.index_files;
    so.staging_window = window;
    cairn::save(t.sd, mem, one, so);
    // 20 MiB of device state went through 2 MiB of pinned memory, 1 MiB at a time.
    CHECK(t.fake.stats().peak_pinned_bytes <= window);
    CHECK(t.fake.stats().d2h >= 20);
    CHECK(t.fake.live_pinned() == 0);
    CHECK(t.loads_back(mem));
    CHECK(t.fake.misuse().empty());
    for (const auto& m : t.fake.misuse()) MESSAGE(m);
  }
}

TEST_CASE("device tensors: the default window is the pool's capacity, or the state when smaller") {
  big_device_state t;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save_options so;
  so.cuda_runtime = &t.fake.api();
  so.overwrite = true;
  // No window, no pool: the private pool holds the 20 MiB state (under the default 256 MiB).
  cairn::save(t.sd, mem, one, so);
  CHECK(t.fake.stats().peak_pinned_bytes == std::size_t{20} << 20);
  // A pool of 4 MiB (allocated by an earlier, smaller save): the window is its capacity, and
  // the pool is not grown.
  cairn::cuda::staging_pool pool({}, &t.fake.api());
  pool.reserve(std::size_t{4} << 20).value();
  so.staging = &pool;
  const int allocs = t.fake.stats().host_allocs;
  cairn::save(t.sd, mem, one, so);
  CHECK(pool.capacity() == std::size_t{4} << 20);
  CHECK(pool.used() == 0);
  CHECK(t.fake.stats().host_allocs == allocs);
  CHECK(t.loads_back(mem));
  CHECK(t.fake.misuse().empty());
}

TEST_CASE(
    "device tensors: a window smaller than one block is refused, a failed copy fails the "
    "save and keeps the previous checkpoint") {
  big_device_state t;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save_options so;
  so.cuda_runtime = &t.fake.api();
  so.overwrite = true;
  so.staging_window = 1000;
  auto small = cairn::try_save(t.sd, mem, one, so);
  REQUIRE(!small);
  CHECK(small.err().code == cairn::errc::invalid_argument);
  CHECK(small.err().message.find("staging_window") != std::string::npos);
  so.staging_window = std::size_t{2} << 20;
  cairn::save(t.sd, mem, one, so);
  // The fourth device-to-host copy fails: the save fails naming a key, nothing is committed.
  t.fake.fail_memcpy(3);
  auto failed = cairn::try_save(t.sd, mem, one, so);
  REQUIRE(!failed);
  CHECK(failed.err().code == cairn::errc::io);
  CHECK(failed.err().message.find("cudaMemcpyAsync") != std::string::npos);
  CHECK((failed.err().key == "w" || failed.err().key == "v"));
  CHECK(t.loads_back(mem));
}

TEST_CASE(
    "device tensors: an async save over its host budget goes through a window of the "
    "budget") {
  big_device_state t;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  const std::size_t budget = std::size_t{4} << 20;
  cairn::async_saver saver({.runtime = &t.fake.api(), .host_budget = budget});
  auto h = saver.save(t.sd, mem, one, {});
  REQUIRE(h);
  CHECK(h->started().bucketed);
  CHECK(h->written());  // before save() returned: the device tensors may change now
  REQUIRE(h->wait());
  // 20 MiB of device state through 4 MiB of pinned memory.
  CHECK(t.fake.stats().peak_pinned_bytes <= budget);
  CHECK(t.loads_back(mem));
  CHECK(t.fake.misuse().empty());
}

TEST_CASE("device tensors: a load into device memory goes through its window, shared pieces too") {
  big_device_state t;
  cairn::memory_storage mem;
  const std::size_t window = std::size_t{2} << 20;
  {
    cairn::single_communicator one;
    cairn::save_options so;
    so.cuda_runtime = &t.fake.api();
    so.staging_window = window;
    cairn::save(t.sd, mem, one, so);
  }
  REQUIRE(t.fake.stats().pinned_bytes == 0);
  std::atomic<std::uint64_t> shared_in{0};
  // Two ranks: `w` whole on both (read by one, passed to the other: device to host to device),
  // `v` split by columns (every row a separate run into device memory).
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const std::int64_t cols = t.v_shape[1] / 2;
    std::vector<std::byte> v_want(static_cast<std::size_t>(t.v_shape[0] * cols) * 4);
    const cairn::box v_box{{0, comm.rank() * cols}, {t.v_shape[0], cols}};
    cairn_test::fill_block("v", cairn::dtype::f32, t.v_shape, v_box, v_want.data());
    void* w_dev = t.fake.device_malloc(t.w_host.size());
    void* v_dev = t.fake.device_malloc(v_want.size());
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(static_cast<float*>(w_dev), t.w_host.size() / 4),
                                  t.w_shape, comm.rank()));
    sd.add("v", cairn::block("v", std::span(static_cast<float*>(v_dev), v_want.size() / 4),
                             v_box.size, t.v_shape, v_box.offset));
    cairn::load_options lo;
    lo.cuda_runtime = &t.fake.api();
    lo.staging_window = window;
    lo.broadcast_min_bytes = 1 << 10;
    auto stats = cairn::load(sd, mem, comm, lo);
    shared_in += stats.bytes_from_ranks;
    CHECK(t.fake.device_read(w_dev, t.w_host.size()) == t.w_host);
    CHECK(t.fake.device_read(v_dev, v_want.size()) == v_want);
    t.fake.device_free(w_dev);
    t.fake.device_free(v_dev);
  });
  CHECK(shared_in.load() > 0);
  // 28 MiB loaded into device memory through two 2 MiB windows (and saved through one).
  CHECK(t.fake.stats().peak_pinned_bytes <= 2 * window);
  CHECK(t.fake.misuse().empty());
  for (const auto& m : t.fake.misuse()) MESSAGE(m);
}

TEST_CASE("device tensors: a load that converts dtypes writes the converted bytes to the device") {
  fake_runtime fake;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  std::vector<float> w(256 * 64);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) / 7;
  {
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(w), {256, 64}, 0));
    cairn::save(sd, mem, one);
  }
  void* dev = fake.device_malloc(w.size() * 2);
  cairn::state_dict sd;
  sd.add("w",
         cairn::replicated("w", std::span(static_cast<cairn::bf16*>(dev), w.size()), {256, 64}, 0));
  cairn::load_options lo;
  lo.cuda_runtime = &fake.api();
  lo.cast_floats = true;
  auto stats = cairn::load(sd, mem, one, lo);
  CHECK(stats.cast == std::vector<std::string>{"w"});
  std::vector<cairn::bf16> want(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) want[i] = cairn::bf16(w[i]);
  auto got = fake.device_read(dev, w.size() * 2);
  CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
  fake.device_free(dev);
  CHECK(fake.misuse().empty());
}
