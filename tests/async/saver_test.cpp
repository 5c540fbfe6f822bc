// async_saver: the save returns after staging; the checkpoint holds what the tensors held
// then; background failures reach every rank; later saves reuse the staging pool and
// allocate nothing large.
#include "cairn/async/saver.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <optional>
#include <thread>

#include "cairn/storage/fault_injection.hpp"
#include "tests/support/counting_comm.hpp"
#include "tests/support/gated_storage.hpp"
#include "tests/support/test_util.hpp"

// Counts heap allocations larger than 1 MiB while armed (every thread of the process). The
// replacements pair malloc with free on purpose; g++ cannot see that when it inlines them.
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<bool> g_armed{false};
std::atomic<std::uint64_t> g_large{0};
std::atomic<std::uint64_t> g_largest{0};
void* counted(std::size_t n) {
  if (g_armed.load(std::memory_order_relaxed) && n > (std::size_t{1} << 20)) {
    g_large.fetch_add(1);
    std::uint64_t prev = g_largest.load();
    while (n > prev && !g_largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's buffer uses them): every form that pairs with the
// deletes above must allocate with malloc.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace cairn_test;

namespace {

/// One rank's state: a row-sharded weight, a column-sharded one (tiled on save), a replicated
/// bias, a step counter and an RNG object.
struct rank_tensors {
  std::vector<float> w, v, b;
  cairn::state_dict sd;
  rank_tensors(int rank, int world, float base) {
    w.assign(256 * 512 / world, 0);
    v.assign(512 * 256 / world, 0);
    b.assign(64, 0);
    fill(rank, base);
    sd.add("w",
           cairn::from_rank_offsets("w", std::span(w), {256 / world, 512}, {{0, rank, world}}));
    sd.add("v",
           cairn::from_rank_offsets("v", std::span(v), {512, 256 / world}, {{1, rank, world}}));
    sd.add("b", cairn::replicated("b", std::span(b), {64}, rank));
    sd.add("step", std::int64_t(base));
    sd.add("rng", cairn::per_rank("rng", std::vector<std::byte>(16, std::byte(rank)), rank, world));
  }
  /// Values that depend on the global element only, so any topology can check them.
  void fill(int rank, float base) {
    const std::size_t rows = w.size() / 512, cols = v.size() / 512;  // local extents
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = base + static_cast<float>(rank * rows * 512 + i);
    for (std::size_t r = 0; r < 512; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        v[r * cols + c] = -base - static_cast<float>(r * 256 + rank * cols + c);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = base + static_cast<float>(i);
  }
};

/// Loads the checkpoint on `world` ranks into fresh state and compares with fill(base).
bool loads_as(cairn::storage_ref st, int world, float base) {
  std::atomic<int> bad{0};
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    rank_tensors want(comm.rank(), world, base), got(comm.rank(), world, -1);
    cairn::load_options lo;
    lo.object_mapping = cairn::objects_modulo();
    cairn::load(got.sd, st, comm, lo);
    if (got.w != want.w || got.v != want.v || got.b != want.b) ++bad;
    if (std::get<cairn::common_value>(*got.sd.find("step")).as<std::int64_t>() !=
        static_cast<std::int64_t>(base))
      ++bad;
  });
  return bad == 0;
}

/// Saves fill(base) on `world` ranks, synchronously: the checkpoint a later save must leave.
void save_on(cairn::storage_ref st, int world, float base, const cairn::save_options& so) {
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    rank_tensors s(comm.rank(), world, base);
    cairn::save(s.sd, st, comm, so);
  });
}

}  // namespace

TEST_CASE("async save: the checkpoint holds the values at the time save returned") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::save_options so;
  so.block_size = 16 << 10;  // several tiles per chunk
  so.overwrite = true;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 4, 10);
    for (int round = 0; round < 3; ++round) {
      float base = 10.0f + static_cast<float>(round);
      s.fill(comm.rank(), base);
      std::get<cairn::common_value>(*s.sd.find("step")) =
          cairn::common_value::of(std::int64_t(base));
      auto h = saver.save(s.sd, disk, comm, so);
      REQUIRE(h);
      // Training goes on at once: every source buffer changes before the write finishes.
      s.fill(comm.rank(), 1000.0f + static_cast<float>(round));
      if (round < 2) {
        auto r = h->wait();
        REQUIRE(r);
        CHECK(r->bytes_written > 0);
      }
    }
    REQUIRE(saver.finalize());
    CHECK(saver.pool().allocations() == 1);  // sized on the first save, reused after
  });
  CHECK(loads_as(disk, 4, 12.0f));
  CHECK(loads_as(disk, 2, 12.0f));  // and on another topology
  CHECK(cairn::verify_checkpoint(disk).value().empty());
}

TEST_CASE("async save: a save in flight is committed by the next one, or refused") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 2, 1);
    auto h1 = saver.save(s.sd, mem, comm, so);
    REQUIRE(h1);
    s.fill(comm.rank(), 2);
    std::get<cairn::common_value>(*s.sd.find("step")) = cairn::common_value::of(std::int64_t{2});
    auto h2 = saver.save(s.sd, mem, comm, so);  // commits h1 first
    REQUIRE(h2);
    CHECK(h1->wait());  // already committed: its result
    CHECK(saver.in_flight());
    REQUIRE(h2->wait());
    CHECK(!saver.in_flight());

    cairn::async_saver strict(
        cairn::async_saver_options{.in_flight = cairn::on_save_in_flight::fail});
    REQUIRE(strict.save(s.sd, mem, comm, so));
    auto refused = strict.save(s.sd, mem, comm, so);
    REQUIRE(!refused);
    CHECK(refused.err().code == cairn::errc::invalid_argument);
    CHECK(strict.finalize());
  });
  CHECK(loads_as(mem, 2, 2));
}

TEST_CASE("async save: a failing background write reaches every rank, the old checkpoint stays") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::save_options so;
  so.overwrite = true;
  so.block_size = 16 << 10;
  // A good checkpoint first.
  save_on(disk, 4, 5, so);
  cairn::faulty_storage<cairn::file_storage> faulty(disk);
  faulty.fail_after_writes(3);  // some rank's background write fails part-way
  std::vector<std::string> errors(4);
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 4, 6);
    auto h = saver.save(s.sd, faulty, comm, so);
    REQUIRE(h);  // staging succeeded: the failure is in the background
    auto r = h->wait();
    REQUIRE(!r);
    errors[comm.rank()] = r.err().describe();
    CHECK(r.err().rank >= 0);
    CHECK(!r.err().file.empty());
  });
  for (const auto& e : errors) {
    CHECK(e.find("injected failure") != std::string::npos);
    CHECK(e == errors[0]);  // the same error everywhere
  }
  CHECK(loads_as(disk, 4, 5));  // nothing committed: the previous checkpoint loads
}

namespace {

using gated_memory = cairn_test::gated_storage<cairn::memory_storage>;

}  // namespace

TEST_CASE("async save: staged bytes changed before the write fail the save on every rank") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  save_on(mem, 2, 5, so);
  gated_memory gated(mem);
  std::vector<std::optional<cairn::error>> errors(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 2, 6);
    auto h = saver.save(s.sd, gated, comm, so);
    REQUIRE(h);
    // Both background writers are past their checksums and waiting on the storage: a stray
    // write into rank 0's staging pool now is what the snapshot check must catch.
    while (gated.arrived.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    comm.barrier();
    if (comm.rank() == 0) saver.pool().buffer()[3] ^= std::byte{0x40};
    comm.barrier();
    gated.open();
    auto r = h->wait();
    if (!r) errors[static_cast<std::size_t>(comm.rank())] = r.err();
  });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK(e->code == cairn::errc::corrupt);
    CHECK(e->rank == 0);
    CHECK(!e->key.empty());
    CHECK(e->message.find("changed between staging and the end of the write") != std::string::npos);
  }
  CHECK(loads_as(mem, 2, 5));  // nothing of the failed save is committed
}

TEST_CASE("async save: a rank whose background write hangs fails every rank's commit, named") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  save_on(mem, 4, 5, so);
  std::vector<std::optional<cairn::error>> errors(4);
  std::atomic<int> failed{0};
  cairn::run_ranks(4, std::chrono::milliseconds(1000), [&](cairn::thread_communicator& comm) {
    gated_memory mine(mem);  // rank 1's disk hangs until the others have given up on it
    if (comm.rank() != 1) mine.open();
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 4, 6);
    auto h = saver.save(s.sd, mine, comm, so);
    REQUIRE(h);
    if (comm.rank() == 1) {
      while (failed.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      mine.open();
    }
    auto r = h->wait();  // the commit ran (or failed) on the background thread's duplicate
    if (!r) errors[static_cast<std::size_t>(comm.rank())] = r.err();
    ++failed;
  });
  for (int r : {0, 2, 3}) {
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)]->code == cairn::errc::comm);
    CHECK(names_missing(errors[static_cast<std::size_t>(r)]->describe(), 1));
  }
  REQUIRE(errors[1]);  // it came back to an aborted group
  CHECK(errors[1]->code == cairn::errc::comm);
  CHECK(loads_as(mem, 4, 5));  // nothing of the failed save is committed
}

TEST_CASE("async save: an unchanged staging pool passes the snapshot check") {
  cairn::memory_storage mem;
  gated_memory gated(mem);
  gated.open();
  cairn::save_options so;
  so.overwrite = true;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 2, 8);
    auto h = saver.save(s.sd, gated, comm, so);
    REQUIRE(h);
    s.fill(comm.rank(), 9);  // the caller's tensors are not the staged copy
    REQUIRE(h->wait());
  });
  CHECK(gated.arrived.load() > 0);
  CHECK(loads_as(mem, 2, 8));
}

TEST_CASE("async save: over a rank's host budget, it is written in buckets before save returns") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  save_on(mem, 2, 5, so);
  // Rank 0 stages about 512 KiB (w, v, b). A budget of 256 KiB cannot hold one 1 MiB checksum
  // block: every rank fails, with rank 0's error, before anything is staged or written.
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver({.host_budget = comm.rank() == 0 ? std::size_t{256} << 10 : 0});
    rank_tensors s(comm.rank(), 2, 6);
    auto h = saver.save(s.sd, mem, comm, so);
    REQUIRE(!h);
    CHECK(h.err().rank == 0);
    CHECK(h.err().code == cairn::errc::resource);  // rank 0's error, on every rank
    CHECK(h.err().message.find("more than its host_budget of 262144") != std::string::npos);
    CHECK(h.err().message.find("one checksum block") != std::string::npos);
    if (comm.rank() == 0) CHECK(saver.pool().capacity() == 0);  // nothing was allocated
    CHECK(!saver.in_flight());
  });
  CHECK(loads_as(mem, 2, 5));
  // With 64 KiB blocks it fits in buckets: rank 0's part is written before save() returns (so
  // its tensors may change at once, unstaged), rank 1's is staged and written in the background.
  so.block_size = 64 << 10;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver({.host_budget = comm.rank() == 0 ? std::size_t{256} << 10 : 0});
    rank_tensors s(comm.rank(), 2, 7);
    auto h = saver.save(s.sd, mem, comm, so);
    REQUIRE(h);
    CHECK(h->started().bucketed == (comm.rank() == 0));
    if (comm.rank() == 0) {
      CHECK(h->started().staged_bytes == 0);
      CHECK(saver.pool().capacity() == 0);  // host tensors are written in place
      CHECK(h->written());
    }
    s.fill(comm.rank(), 9);
    REQUIRE(h->wait());
  });
  CHECK(loads_as(mem, 2, 7));
}

TEST_CASE("async save: written() tells, without blocking, when the background write has ended") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 2, 3);
    auto h = saver.save(s.sd, mem, comm, so);
    REQUIRE(h);
    // Poll as a training loop would between steps; the write ends without any call into cairn.
    REQUIRE(poll_until([&] { return h->written(); }));
    CHECK(saver.in_flight());  // written; its result is not collected until wait()
    REQUIRE(h->wait());
    CHECK(h->written());
    CHECK(!saver.in_flight());
  });
  CHECK(loads_as(mem, 2, 3));
}

TEST_CASE("async save: loadable before any further call, done() tells without blocking") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  std::atomic<int> loaded_early{0};
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::async_saver saver;
    rank_tensors s(comm.rank(), 2, 3);
    auto h = saver.save(s.sd, mem, comm, so);
    REQUIRE(h);
    CHECK(saver.commits_in_background());
    REQUIRE(poll_until([&] { return h->done(); }));
    CHECK(h->written());
    comm.barrier();
    // Neither rank called wait(), finalize() or save() again: the checkpoint loads already.
    if (comm.rank() == 0 && loads_as(mem, 2, 3)) ++loaded_early;
    comm.barrier();
    REQUIRE(h->wait());  // only collects the result
  });
  CHECK(loaded_early == 1);
}

TEST_CASE("async save: a saver destroyed with a save in flight commits it in the background") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  std::vector<std::vector<cairn::error>> dropped(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    auto& mine = dropped[static_cast<std::size_t>(comm.rank())];
    cairn::async_saver saver({.on_dropped = [&](const cairn::error& e) { mine.push_back(e); }});
    rank_tensors s(comm.rank(), 2, 7);
    REQUIRE(saver.save(s.sd, mem, comm, so));
  });  // no finalize(): the destructor waits, the save is committed
  CHECK(dropped[0].empty());
  CHECK(dropped[1].empty());
  CHECK(loads_as(mem, 2, 7));
}

TEST_CASE("async save: a save that fails in the background and is never collected is reported") {
  temp_dir dir;
  cairn::file_storage disk(dir.path);
  cairn::save_options so;
  so.overwrite = true;
  save_on(disk, 2, 4, so);
  cairn::faulty_storage<cairn::file_storage> faulty(disk);
  faulty.fail_after_writes(1);
  std::vector<std::vector<cairn::error>> dropped(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    auto& mine = dropped[static_cast<std::size_t>(comm.rank())];
    cairn::async_saver saver({.on_dropped = [&](const cairn::error& e) { mine.push_back(e); }});
    rank_tensors s(comm.rank(), 2, 8);
    REQUIRE(saver.save(s.sd, faulty, comm, so));
  });
  for (const auto& mine : dropped) {
    REQUIRE(mine.size() == 1);
    CHECK(mine[0].code == cairn::errc::incomplete_checkpoint);
    CHECK(mine[0].message.find("failed in the background") != std::string::npos);
    CHECK(mine[0].message.find("injected failure") != std::string::npos);
  }
  CHECK(loads_as(disk, 2, 4));  // the previous checkpoint stays the loadable one
}

TEST_CASE("async save: without a duplicate communicator, a destroyed saver reports the drop") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.overwrite = true;
  save_on(mem, 2, 4, so);
  std::vector<std::vector<cairn::error>> dropped(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& thread_comm) {
    // A communicator of the user's without duplicate(): the commit waits for the next call.
    std::vector<collective_use> log;
    counting_comm comm{thread_comm, &log};
    auto& mine = dropped[static_cast<std::size_t>(comm.rank())];
    {
      cairn::async_saver saver({.on_dropped = [&](const cairn::error& e) { mine.push_back(e); }});
      rank_tensors s(comm.rank(), 2, 7);
      auto h = saver.save(s.sd, mem, comm, so);
      REQUIRE(h);
      CHECK(!saver.commits_in_background());
      CHECK(poll_until([&] { return h->written(); }));
      CHECK(!h->done());
    }  // no finalize(): the save is dropped, and says so
    REQUIRE(mine.size() == 1);
    CHECK(mine[0].code == cairn::errc::incomplete_checkpoint);
    CHECK(mine[0].rank == comm.rank());
    CHECK(mine[0].message.find("not committed") != std::string::npos);
  });
  CHECK(loads_as(mem, 2, 4));  // the previous checkpoint stays the loadable one
}

TEST_CASE(
    "async save: after the first save, no staging allocation and no heap allocation > 1 MiB") {
  temp_dir dir;
  cairn::file_storage mem(dir.path);  // the kernel holds the bytes, not the heap
  cairn::save_options so;
  so.overwrite = true;
  cairn::save_plan_cache cache;
  so.plan_cache = &cache;
  cairn::single_communicator comm;
  cairn::async_saver saver;
  // 8 MiB of state: far above the 1 MiB threshold, so a per-save staging buffer would show.
  std::vector<float> big(2 << 20);
  std::vector<float> cols(512 * 512);
  cairn::state_dict sd;
  sd.add("big", cairn::replicated("big", std::span(big), {2 << 20}, 0));
  sd.add("cols", cairn::replicated("cols", std::span(cols), {512, 512}, 0));
  sd.add("step", std::int64_t{0});
  REQUIRE(saver.save(sd, mem, comm, so));
  REQUIRE(saver.finalize());
  const auto allocations = saver.pool().allocations();
  g_large = 0;
  g_largest = 0;
  g_armed = true;
  for (int i = 0; i < 3; ++i) {
    big[0] = static_cast<float>(i);
    auto h = saver.save(sd, mem, comm, so);
    REQUIRE(h);
    CHECK(h->started().plan_reused);
    REQUIRE(h->wait());
  }
  g_armed = false;
  CHECK(saver.pool().allocations() == allocations);
  INFO("largest allocation: " << g_largest.load());
  CHECK(g_large.load() == 0);
}
