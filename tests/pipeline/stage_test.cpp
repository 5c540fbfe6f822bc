// Synchronous save and load of tensors that live in (fake) device memory: bytes go through
// pinned staging memory with cudaMemcpyAsync, never touched by host code directly.
#include <doctest/doctest.h>

#include <cstring>

#include "cairn/cairn.hpp"
#include "cairn/cuda/staging_pool.hpp"
#include "cairn/cuda/testing/fake_runtime.hpp"
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
