// The fault matrix: a save (into a fresh place, and over a committed checkpoint) and a load, on
// thread ranks, with the k-th storage operation failing in each way real storage fails
// (cairn::fault_mode), for every k. Whatever happens: every rank gets the same outcome, a save
// that failed leaves the previous checkpoint loading exactly, a save that succeeded loads
// exactly (or, when the disk lied, is refused on load), a load returns the saved data or an
// error, never other data, and the next save leaves no garbage behind.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/storage/fault_injection.hpp"

namespace {

constexpr int save_world = 3;
constexpr int load_world = 2;
constexpr std::int64_t rows = 10, cols = 6, bias = 5;

/// Rows [first, last) of `rows` held by rank r of n (uneven: 3, 4, 3 for n = 3).
std::pair<std::int64_t, std::int64_t> row_range(int r, int n) {
  return {rows * r / n, rows * (r + 1) / n};
}

float w_value(int gen, std::int64_t i) { return static_cast<float>(gen * 1000 + i); }
std::int32_t b_value(int gen, std::int64_t i) { return gen * 100 + static_cast<std::int32_t>(i); }
std::vector<std::byte> rng_value(int gen, int rank) {
  return {std::byte(gen), std::byte(rank), std::byte(0x5a), std::byte(gen ^ rank)};
}

/// One rank's state: rows of a [10, 6] f32 weight (uneven blocks), a replicated [5] i32 bias
/// (every rank a replica), a per-rank object and a common step.
struct rank_state {
  std::vector<float> w;
  std::vector<std::int32_t> b;
  cairn::state_dict sd;

  rank_state(int rank, int world, int gen) {
    auto [r0, r1] = row_range(rank, world);
    w.resize(static_cast<std::size_t>((r1 - r0) * cols));
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(w.size()); ++i)
      w[static_cast<std::size_t>(i)] = gen ? w_value(gen, r0 * cols + i) : -1.0f;
    b.resize(bias);
    for (std::int64_t i = 0; i < bias; ++i)
      b[static_cast<std::size_t>(i)] = gen ? b_value(gen, i) : -1;
    sd.add("w", cairn::block("w", std::span(w), {r1 - r0, cols}, {rows, cols}, {r0, 0}));
    sd.add("b", cairn::replicated("b", std::span(b), {bias}, rank));
    sd.add("rng",
           cairn::byte_object{
               "rng", gen ? rng_value(gen, rank) : std::vector<std::byte>{}, {world}, {rank}, 0});
    sd.add("step", std::int64_t{gen});
  }

  /// The generation this rank's state holds exactly (loaded on `world` ranks from a checkpoint
  /// saved on save_world), or nullopt when any value belongs to no single generation.
  std::optional<int> generation(int rank, int world) {
    auto step = std::get<cairn::common_value>(*sd.find("step")).as<std::int64_t>();
    int gen = static_cast<int>(step);
    auto [r0, r1] = row_range(rank, world);
    (void)r1;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(w.size()); ++i)
      if (w[static_cast<std::size_t>(i)] != w_value(gen, r0 * cols + i)) return std::nullopt;
    for (std::int64_t i = 0; i < bias; ++i)
      if (b[static_cast<std::size_t>(i)] != b_value(gen, i)) return std::nullopt;
    auto& rng = std::get<cairn::byte_object>(*sd.find("rng"));
    if (rng.value != rng_value(gen, rank % save_world)) return std::nullopt;
    return gen;
  }
};

cairn::save_options save_opts(bool zstd, bool overwrite, bool index_files = false) {
  cairn::save_options so;
  so.index_files = index_files;  // format version 4
  so.block_size = 64;            // chunks larger than a block are tiled: more operations to fail
  so.zstd_level = zstd ? 3 : 0;
  so.overwrite = overwrite;
  return so;
}

/// Saves generation `gen` on save_world thread ranks; the outcome every rank saw (all alike,
/// checked), as an error code or nullopt for success.
std::optional<cairn::errc> save_gen(cairn::storage_ref st,
                                    int gen,
                                    const cairn::save_options& so,
                                    bool async = false) {
  std::mutex mu;
  std::vector<std::optional<cairn::errc>> outcome;
  std::vector<std::string> messages;
  cairn::run_ranks(save_world, [&](cairn::thread_communicator& comm) {
    rank_state s(comm.rank(), save_world, gen);
    cairn::result<cairn::save_stats> r = cairn::make_error(cairn::errc::io, "not run");
    if (async) {
      // Staged and written in the background; the commit happens at wait() on every rank.
      cairn::async_saver saver;
      auto h = saver.save(s.sd, st, comm, so);
      r = h ? h->wait() : cairn::result<cairn::save_stats>(h.err());
    } else {
      r = cairn::try_save(s.sd, st, comm, so);
    }
    std::lock_guard lock(mu);
    outcome.push_back(r ? std::nullopt : std::optional(r.err().code));
    messages.push_back(r ? "ok" : r.err().describe());
  });
  for (std::size_t i = 1; i < outcome.size(); ++i) {
    INFO("rank outcomes: " << messages[0] << " | " << messages[i]);
    CHECK(outcome[i] == outcome[0]);
  }
  return outcome[0];
}

/// Loads on load_world thread ranks. Returns the generation every rank loaded, or the error
/// every rank got; fails the test when ranks disagree or a rank loaded values of no single
/// generation (wrong data).
cairn::result<int> load_gen(cairn::storage_ref st) {
  std::mutex mu;
  std::vector<cairn::result<int>> got;
  cairn::load_options lo;
  lo.object_mapping = cairn::objects_modulo();
  lo.broadcast_min_bytes = 1;  // the replicated bias is read once and broadcast
  cairn::run_ranks(load_world, [&](cairn::thread_communicator& comm) {
    rank_state s(comm.rank(), load_world, 0);
    auto r = cairn::try_load(s.sd, st, comm, lo);
    cairn::result<int> out = r ? cairn::result<int>(-1) : cairn::result<int>(r.err());
    if (r) {
      auto gen = s.generation(comm.rank(), load_world);
      INFO("rank " << comm.rank() << " loaded values of no single generation");
      CHECK(gen.has_value());
      out = gen ? cairn::result<int>(*gen)
                : cairn::result<int>(cairn::make_error(cairn::errc::corrupt, "wrong data"));
    }
    std::lock_guard lock(mu);
    got.push_back(std::move(out));
  });
  for (std::size_t i = 1; i < got.size(); ++i) {
    CHECK(got[i].has_value() == got[0].has_value());
    if (got[i] && got[0]) CHECK(*got[i] == *got[0]);
  }
  return got[0];
}

/// After an unfaulted save, `mem` holds exactly metadata.json and the files it references.
void check_no_garbage(cairn::memory_storage& mem) {
  auto m = cairn::read_metadata(mem);
  REQUIRE(m);
  std::set<std::string> want{"metadata.json"};
  for (const auto& f : m->files) want.insert(f.name);
  auto names = mem.list("").value();
  CHECK(std::set<std::string>(names.begin(), names.end()) == want);
}

}  // namespace

TEST_CASE("fault matrix: every storage operation of a save fails in every way") {
  // (zstd, async, index files): plain, compressed, through async_saver, format version 4.
  struct variant {
    bool zstd, async, index;
  };
  for (variant flags : {variant{false, false, false}, variant{true, false, false},
                        variant{false, true, false}, variant{false, false, true}}) {
    const bool zstd = flags.zstd, async = flags.async, v4 = flags.index;
    for (bool fresh : {true, false}) {
      // Count the operations of an unfaulted save.
      std::uint64_t ops = 0;
      {
        cairn::memory_storage mem;
        if (!fresh) REQUIRE(!save_gen(mem, 1, save_opts(zstd, false, v4)));
        cairn::faulty_storage faulty(mem);
        REQUIRE(!save_gen(faulty, 2, save_opts(zstd, !fresh, v4), async));
        ops = faulty.ops();
      }
      REQUIRE(ops > 10);
      std::size_t failed = 0, succeeded = 0, refused = 0;
      for (cairn::fault_mode mode : cairn::all_fault_modes) {
        for (std::uint64_t k = 0;; ++k) {
          cairn::memory_storage mem;
          if (!fresh) REQUIRE(!save_gen(mem, 1, save_opts(zstd, false, v4)));
          cairn::faulty_storage faulty(mem);
          faulty.fail_op(k, mode);
          auto outcome = save_gen(faulty, 2, save_opts(zstd, !fresh, v4), async);
          if (!faulty.fault_fired()) {
            CHECK(!outcome);
            CHECK(k >= ops / 2);  // the operation count varies a little with thread timing
            break;
          }
          INFO("zstd=" << zstd << " async=" << async << " v4=" << v4 << " fresh=" << fresh
                       << " mode=" << std::string(cairn::fault_mode_name(mode)) << " k=" << k
                       << " fault at: " << faulty.fault_site());
          auto loaded = load_gen(mem);
          if (outcome) {
            ++failed;
            if (fresh) {
              // Nothing committed: what the failed save left (nothing at all, or files
              // without metadata).
              REQUIRE(!loaded);
              CHECK((loaded.err().code == cairn::errc::incomplete_checkpoint ||
                     loaded.err().code == cairn::errc::not_found));
            } else {
              REQUIRE(loaded);
              CHECK(*loaded == 1);  // the previous checkpoint, exactly
            }
          } else if (loaded) {
            ++succeeded;
            CHECK(*loaded == 2);
          } else {
            // Committed but unloadable: only a disk that reported a short write as done may
            // cause that, and the load must say so rather than return other data.
            ++refused;
            CHECK(mode == cairn::fault_mode::lie_partial);
          }
          // The next save succeeds, loads exactly and leaves no garbage.
          REQUIRE(!save_gen(mem, 3, save_opts(zstd, true, v4)));
          auto again = load_gen(mem);
          REQUIRE(again);
          CHECK(*again == 3);
          check_no_garbage(mem);
        }
      }
      MESSAGE("save matrix zstd=" << zstd << " async=" << async << " v4=" << v4
                                  << " fresh=" << fresh << ": " << ops
                                  << " operations x 5 modes: " << failed << " failed, " << succeeded
                                  << " committed, " << refused << " committed but refused on load");
    }
  }
}

TEST_CASE("fault matrix: every storage operation of a load fails in every way") {
  for (auto flags : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
    const bool zstd = flags.first, v4 = flags.second;  // INFO captures them: no bindings
    cairn::memory_storage mem;
    REQUIRE(!save_gen(mem, 1, save_opts(zstd, false, v4)));
    cairn::faulty_storage faulty(mem);
    auto clean = load_gen(faulty);
    REQUIRE(clean);
    REQUIRE(*clean == 1);
    const std::uint64_t ops = faulty.ops();
    std::size_t loaded_ok = 0, refused = 0;
    for (cairn::fault_mode mode : cairn::all_fault_modes) {
      for (std::uint64_t k = 0;; ++k) {
        faulty.fail_op(k, mode);
        auto got = load_gen(faulty);
        if (!faulty.fault_fired()) {
          CHECK(k >= ops / 2);
          break;
        }
        INFO("zstd=" << zstd << " v4=" << v4
                     << " mode=" << std::string(cairn::fault_mode_name(mode)) << " k=" << k
                     << " fault at: " << faulty.fault_site());
        if (got) {
          ++loaded_ok;
          CHECK(*got == 1);
        } else {
          ++refused;
          // A corrupted or short read that was reported as fine is caught by a checksum.
          if (mode == cairn::fault_mode::corrupt_read || mode == cairn::fault_mode::lie_partial)
            CHECK((got.err().code == cairn::errc::corrupt ||
                   got.err().code == cairn::errc::incomplete_checkpoint ||
                   got.err().code == cairn::errc::comm));
        }
      }
    }
    faulty.disarm();
    MESSAGE("load matrix zstd=" << zstd << " v4=" << v4 << ": " << ops << " operations x 5 modes: "
                                << loaded_ok << " loaded exactly, " << refused << " refused");
  }
}
