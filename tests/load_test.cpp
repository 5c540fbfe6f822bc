// Property test: random tensors with random block shardings saved on N thread ranks load on M
// thread ranks element-exactly, for every N, M in 1..8.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "cairn/storage/decorator.hpp"
#include "tests/support/property.hpp"

using namespace cairn_test;

TEST_CASE(
    "random shardings (block, uneven, replicated, flattened, prepended) saved on N load on M") {
  std::mt19937 rng(20261122);
  int combos = 0;
  const layout_kind kinds[] = {layout_kind::block, layout_kind::flattened, layout_kind::prepended};
  for (int n = 1; n <= 8; ++n) {
    for (int m = 1; m <= 8; ++m) {
      // Blocks both ways, then each other layout on one side.
      const std::pair<layout_kind, layout_kind> trials[] = {{kinds[0], kinds[0]},
                                                            {kinds[1], kinds[0]},
                                                            {kinds[0], kinds[1]},
                                                            {kinds[2], kinds[0]},
                                                            {kinds[0], kinds[2]}};
      for (const auto& kinds_pair : trials) {
        const layout_kind save_kind = kinds_pair.first, load_kind = kinds_pair.second;
        property_case c = random_case(rng, 1 + static_cast<int>(rng() % 4), n, m);
        cairn::memory_storage mem;
        cairn::save_options so;
        so.block_size = 16 + rng() % 64;   // small blocks: partial reads cross many blocks
        so.index_files = combos % 2 == 0;  // format versions 4 and 3 in turn
        save_on_threads(mem, c, n, save_kind, so);
        // Every other pair of combos shares every piece ranks want alike, passed on in steps
        // of 24 bytes (pieces cross steps; replicated and overlapping requests form trees).
        const bool share_all = combos / 2 % 2 == 1;
        auto failures = load_failures_on_threads(
            mem, c, m, load_kind,
            share_all ? cairn::load_options{.broadcast_min_bytes = 1, .share_step_bytes = 24}
                      : cairn::load_options{});
        INFO("N=" << n << " M=" << m << " save " << kind_name(save_kind) << " load "
                  << kind_name(load_kind) << (share_all ? " sharing every piece" : ""));
        CHECK(failures.empty());
        for (const auto& f : failures) MESSAGE(f);
        ++combos;
      }
    }
  }
  CHECK(combos == 320);
}

namespace {

/// Random shardings saved on N and loaded on M thread ranks, N, M in 1..6, saved in blocks and
/// in flattened slices, each twice with one plan cache per rank (the second save reuses the
/// plan). `configure(so, combo)` sets the save options, `check(mem)` looks at the checkpoint
/// before it loads. Returns the number of combinations run.
template <class Configure, class Check>
int n_to_m_saved_twice(std::uint32_t seed, Configure configure, Check check) {
  std::mt19937 rng(seed);
  int combos = 0;
  for (int n = 1; n <= 6; ++n) {
    for (int m = 1; m <= 6; ++m) {
      for (layout_kind save_kind : {layout_kind::block, layout_kind::flattened}) {
        property_case c = random_case(rng, 1 + static_cast<int>(rng() % 4), n, m);
        cairn::memory_storage mem;
        cairn::save_options so;
        so.block_size = 16 + rng() % 64;
        so.zstd_level = combos % 3 == 0 ? 1 : 0;
        so.overwrite = true;
        configure(so, combos);
        std::vector<cairn::save_plan_cache> caches(static_cast<std::size_t>(n));
        for (int rep = 0; rep < 2; ++rep) save_on_threads(mem, c, n, save_kind, so, &caches);
        for (const auto& cache : caches) CHECK(cache.hits() == 1);
        check(mem);
        auto failures = load_failures_on_threads(mem, c, m, layout_kind::block);
        INFO("N=" << n << " M=" << m << " save " << kind_name(save_kind));
        CHECK(failures.empty());
        for (const auto& f : failures) MESSAGE(f);
        ++combos;
      }
    }
  }
  return combos;
}

}  // namespace

TEST_CASE(
    "scalable planning, format version 3: random shardings saved on N load on M, with zstd and a "
    "plan cache") {
  int combos = n_to_m_saved_twice(
      20261124,
      [](cairn::save_options& so, int) {
        so.scalable_planning = true;
        so.index_files = false;
      },
      [](cairn::memory_storage& mem) {
        auto json = cairn::read_metadata_json(mem);
        REQUIRE(json);
        CHECK(json->find("\"version\":4") == std::string::npos);
      });
  CHECK(combos == 72);
}

TEST_CASE("format version 4: random shardings saved on N load on M through index files") {
  int combos = n_to_m_saved_twice(
      20261125,
      [](cairn::save_options& so, int combo) {
        so.index_files = true;
        so.scalable_planning = combo % 2 == 0;
      },
      [](cairn::memory_storage& mem) {
        auto json = cairn::read_metadata_json(mem);
        REQUIRE(json);
        CHECK(json->find("\"chunks\":[") == std::string::npos);  // the manifest lists none
        CHECK(json->find("\"version\":5") != std::string::npos);
        auto problems = cairn::verify_checkpoint(mem);
        REQUIRE(problems);
        CHECK(problems->empty());
      });
  CHECK(combos == 72);
}

TEST_CASE("each rank reads only the checksum blocks it needs") {
  // A 64 x 64 f32 tensor saved in 4 row blocks, loaded in 2 row blocks with 1 KiB checksum
  // blocks: every byte read is needed.
  cairn::memory_storage mem;
  cairn::shape global{64, 64};
  grid save_grid{{{0, 16, 32, 48, 64}, {0, 64}}};
  grid load_grid{{{0, 32, 64}, {0, 64}}};
  cairn::save_options so;
  so.block_size = 1024;
  std::vector<tensor_spec> specs{{"w", cairn::dtype::f32, global}};
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, specs, {save_grid}, comm.rank(), 4, true);
    cairn::save(rs.sd, mem, comm, so);
  });
  std::vector<cairn::load_stats> stats(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, specs, {load_grid}, comm.rank(), 2, false);
    stats[comm.rank()] = cairn::load(rs.sd, mem, comm);
  });
  for (const auto& s : stats) {
    CHECK(s.bytes_needed == 32 * 64 * 4);
    CHECK(s.bytes_read == s.bytes_needed);
  }
  // Column blocks: each rank needs half of every row, which is every other 128-byte run; with
  // 128-byte checksum blocks it still reads only what it needs.
  cairn::memory_storage mem2;
  so.block_size = 128;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, specs, {save_grid}, comm.rank(), 4, true);
    cairn::save(rs.sd, mem2, comm, so);
  });
  grid col_grid{{{0, 64}, {0, 32, 64}}};
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, specs, {col_grid}, comm.rank(), 2, false);
    stats[comm.rank()] = cairn::load(rs.sd, mem2, comm);
    std::vector<std::byte> want(rs.buffers[0].size());
    fill_block("w", cairn::dtype::f32, global, col_grid.cell(comm.rank()), want.data());
    CHECK(want == rs.buffers[0]);
  });
  for (const auto& s : stats) CHECK(s.bytes_read == s.bytes_needed);
}

TEST_CASE("replicated tensors are written by all their holders in equal shares") {
  // 4 data-parallel replicas of the same state: one tensor larger than all others together,
  // plus a few small ones. Every rank should write about a quarter.
  std::vector<tensor_spec> specs{{"big", cairn::dtype::f32, {1000, 700}},
                                 {"mid", cairn::dtype::bf16, {300, 200}},
                                 {"small", cairn::dtype::i64, {77}},
                                 {"odd", cairn::dtype::u8, {3, 5, 7}}};
  grid whole_big{{{0, 1000}, {0, 700}}}, whole_mid{{{0, 300}, {0, 200}}}, whole_small{{{0, 77}}},
      whole_odd{{{0, 3}, {0, 5}, {0, 7}}};
  std::vector<grid> grids{whole_big, whole_mid, whole_small, whole_odd};
  for (std::uint64_t min_bytes : {std::uint64_t{64} << 10, std::uint64_t{0}}) {
    CAPTURE(min_bytes);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.block_size = 4096;
    so.balance_min_bytes = min_bytes;
    std::vector<std::uint64_t> per_rank;
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      rank_state rs;
      build_rank(rs, specs, grids, comm.rank(), 4, true);  // rank r > 0 holds replicas
      auto stats = cairn::save(rs.sd, mem, comm, so);
      if (comm.rank() == 0) per_rank = stats.bytes_per_rank;
      CHECK(stats.bytes_written == stats.bytes_per_rank[comm.rank()]);
    });
    REQUIRE(per_rank.size() == 4);
    double total = 0, most = 0;
    for (auto b : per_rank) {
      total += static_cast<double>(b);
      most = std::max(most, static_cast<double>(b));
    }
    MESSAGE("bytes per rank: " << per_rank[0] << " " << per_rank[1] << " " << per_rank[2] << " "
                               << per_rank[3]);
    CHECK(most / (total / 4) <= 1.1);
    // Loads back whole on 3 ranks with another sharding.
    std::vector<grid> load_grids;
    std::mt19937 rng(5);
    for (const auto& s : specs) load_grids.push_back(random_grid(rng, s.global, 3));
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      rank_state rs;
      build_rank(rs, specs, load_grids, comm.rank(), 3, false);
      cairn::load(rs.sd, mem, comm);
      for (std::size_t i = 0; i < specs.size(); ++i) {
        std::vector<std::byte> want(rs.buffers[i].size());
        fill_block(specs[i].key, specs[i].type, specs[i].global,
                   load_grids[i].cell(comm.rank() % load_grids[i].cells()), want.data());
        CHECK(want == rs.buffers[i]);
      }
    });
  }
}

TEST_CASE("per-layer tensors with a prepended layer axis load as one stacked tensor") {
  cairn::memory_storage mem;
  cairn::shape global{3, 4, 6};
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::vector<float> layer(4 * 6);  // this rank's layer, without the layer axis
    cairn::box b{{comm.rank(), 0, 0}, {1, 4, 6}};
    fill_block("stack", cairn::dtype::f32, global, b, reinterpret_cast<std::byte*>(layer.data()));
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("stack", std::span(layer), {4, 6}, {{0, comm.rank(), 3}},
                                         0, /*prepend_axis_num=*/1));
    cairn::save(sd, mem, comm);
  });
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> part(3 * 2 * 6);
    cairn::state_dict sd;
    sd.add("w",
           cairn::from_rank_offsets("stack", std::span(part), {3, 2, 6}, {{1, comm.rank(), 2}}));
    cairn::load(sd, mem, comm);
    std::vector<float> want(part.size());
    fill_block("stack", cairn::dtype::f32, global, cairn::box{{0, 2 * comm.rank(), 0}, {3, 2, 6}},
               reinterpret_cast<std::byte*>(want.data()));
    CHECK(std::memcmp(want.data(), part.data(), part.size() * 4) == 0);
  });
  // ... and back into per-layer shards of another split (layer axis prepended, rows split).
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> rows(2 * 6);
    cairn::state_dict sd;
    auto t = cairn::from_rank_offsets("stack", std::span(rows), {2, 6},
                                      {{0, 2, 3}, {1, comm.rank(), 2}}, 0, 1);
    sd.add("w", t);
    cairn::load(sd, mem, comm);
    std::vector<float> want(rows.size());
    fill_block("stack", cairn::dtype::f32, global, cairn::box{{2, 2 * comm.rank(), 0}, {1, 2, 6}},
               reinterpret_cast<std::byte*>(want.data()));
    CHECK(std::memcmp(want.data(), rows.data(), rows.size() * 4) == 0);
  });
}

namespace {
/// Cut points splitting `n` into `parts` near-equal pieces (uneven when parts does not divide n).
std::vector<std::int64_t> even_cuts(std::int64_t n, int parts) {
  std::vector<std::int64_t> c;
  for (int i = 0; i <= parts; ++i) c.push_back(n * i / parts);
  return c;
}
}  // namespace

TEST_CASE("tiled chunks: a reshard along any axis reads about only the bytes it needs") {
  // A 2048 x 2048 f32 weight (16 MiB) saved on 4 ranks along one axis, with 64 KiB checksum
  // blocks: each 4 MiB chunk is stored as 64 tiles (8 x 8). Loading it on 1, 2, 3, 4, 6 or 8
  // ranks along either axis reads at most 5 % more than needed when the target's cuts fall on
  // tile edges (power-of-two splits), and the uneven splits are reported.
  const cairn::shape global{2048, 2048};
  std::vector<tensor_spec> specs{{"w", cairn::dtype::f32, global}};
  for (int save_axis : {0, 1}) {
    grid save_grid{
        {even_cuts(2048, save_axis == 0 ? 4 : 1), even_cuts(2048, save_axis == 1 ? 4 : 1)}};
    for (bool tile : {true, false}) {
      cairn::memory_storage mem;
      cairn::save_options so;
      so.block_size = 64 << 10;
      so.tile = tile;
      cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
        rank_state rs;
        build_rank(rs, specs, {save_grid}, comm.rank(), 4, true);
        cairn::save(rs.sd, mem, comm, so);
      });
      std::string line;
      for (int load_axis : {0, 1}) {
        for (int m : {1, 2, 3, 4, 6, 8}) {
          grid load_grid{
              {even_cuts(2048, load_axis == 0 ? m : 1), even_cuts(2048, load_axis == 1 ? m : 1)}};
          std::vector<cairn::load_stats> stats(m);
          std::atomic<int> bad{0};
          cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
            rank_state rs;
            build_rank(rs, specs, {load_grid}, comm.rank(), m, false);
            stats[comm.rank()] = cairn::load(rs.sd, mem, comm);
            std::vector<std::byte> want(rs.buffers[0].size());
            fill_block("w", cairn::dtype::f32, global, load_grid.cell(comm.rank()), want.data());
            if (want != rs.buffers[0]) ++bad;
          });
          CHECK(bad == 0);
          double worst = 0;
          for (const auto& s : stats)
            worst = std::max(
                worst, static_cast<double>(s.bytes_read) / static_cast<double>(s.bytes_needed));
          line += fmt::format(" {}x{}:{:.3f}", load_axis, m, worst);
          INFO("saved along axis " << save_axis << ", loaded on " << m << " ranks along axis "
                                   << load_axis << std::string(tile ? ", tiled" : ", untiled"));
          if (tile && (m & (m - 1)) == 0) CHECK(worst <= 1.05);
        }
      }
      MESSAGE("saved along axis " << save_axis << std::string(tile ? " tiled" : " untiled")
                                  << ": worst bytes read / needed per rank, by load axis x ranks:"
                                  << line);
    }
  }
}

TEST_CASE("load_common reads no index file, load_tensors only the index of its keys") {
  // 4 ranks save 40 tensors: their index sections spread over the owners' index files.
  cairn::memory_storage mem;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    std::vector<std::vector<float>> bufs(40, std::vector<float>(8));
    cairn::state_dict sd;
    for (int i = 0; i < 40; ++i) {
      auto& b = bufs[static_cast<std::size_t>(i)];
      for (std::size_t j = 0; j < b.size(); ++j)
        b[j] = static_cast<float>(i * 1000 + comm.rank() * 8 + static_cast<int>(j));
      const std::string k = "t" + std::to_string(i);
      sd.add(k, cairn::from_rank_offsets(k, std::span(b), {8}, {{0, comm.rank(), 4}}));
    }
    sd.add("step", std::int64_t{7});
    cairn::save(sd, mem, comm);
  });
  struct index_reads : cairn::storage_decorator<cairn::memory_storage> {
    explicit index_reads(cairn::memory_storage& m) : storage_decorator(m) {}
    cairn::result<void> read(std::string_view name, std::uint64_t at, std::span<std::byte> out) {
      if (name.starts_with("index.")) bytes += out.size(), files.insert(std::string(name));
      return storage_decorator::read(name, at, out);
    }
    std::uint64_t bytes = 0;
    std::set<std::string> files;
  };
  std::uint64_t all_index = 0;
  for (const auto& n : mem.list("index.").value()) all_index += mem.size(n).value();
  REQUIRE(mem.list("index.").value().size() > 1);
  index_reads common(mem);
  CHECK(cairn::load_common(common).value().at("step").as<std::int64_t>() == 7);
  CHECK(common.bytes == 0);
  index_reads one(mem);
  auto t = cairn::load_tensors(one, {"t17"}).value();
  REQUIRE(t.at("t17").data.size() == 32 * sizeof(float));
  float v;
  std::memcpy(&v, t.at("t17").data.data() + 31 * sizeof(float), sizeof v);
  CHECK(v == 17 * 1000 + 31);
  CHECK(one.files.size() == 1);  // the owner's index file, and only what it holds of t17
  CHECK(one.bytes * 10 < all_index);
  index_reads every(mem);
  CHECK(cairn::load_tensors(every).value().size() == 40);
  CHECK(every.files.size() == mem.list("index.").value().size());
}

namespace {

/// "w" (bf16 [64, 48], values k/8 rounded to bf16) and "b" (f32 [1000], thirds, not exact in
/// bf16) and "n" (i32 [10]), saved on 2 ranks in row blocks / replicated.
void save_mixed_dtypes(cairn::storage_ref st) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<cairn::bf16> w(32 * 48);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = cairn::bf16(static_cast<float>((r * 32 * 48 + static_cast<int>(i)) % 512) / 8);
    std::vector<float> b(1000);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) / 3;
    std::vector<std::int32_t> n(10, 7);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {32, 48}, {{0, r, 2}}));
    sd.add("b", cairn::replicated("b", std::span(b), {1000}, r));
    sd.add("n", cairn::replicated("n", std::span(n), {10}, r));
    cairn::save(sd, st, comm);
  });
}

}  // namespace

TEST_CASE("load: cast_floats converts floating dtypes on any number of ranks and names the keys") {
  cairn::memory_storage mem;
  save_mixed_dtypes(mem);
  std::atomic<int> bad{0};
  // Three ranks, column blocks of "w" as f32 (widening: exact, each run a piece of a row), "b"
  // as bf16 (narrowing: round to nearest even), "n" as saved.
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    const std::int64_t lo = 48 * comm.rank() / 3, hi = 48 * (comm.rank() + 1) / 3;
    std::vector<float> w(static_cast<std::size_t>(64 * (hi - lo)));
    std::vector<cairn::bf16> b(1000);
    std::vector<std::int32_t> n(10);
    cairn::state_dict sd;
    sd.add("w", cairn::block("w", std::span(w), {64, hi - lo}, {64, 48}, {0, lo}));
    sd.add("b", cairn::replicated("b", std::span(b), {1000}, comm.rank()));
    sd.add("n", cairn::replicated("n", std::span(n), {10}, comm.rank()));
    cairn::load_options lo_opt;
    lo_opt.cast_floats = true;
    auto stats = cairn::load(sd, mem, comm, lo_opt);
    std::sort(stats.cast.begin(), stats.cast.end());
    if (stats.cast != std::vector<std::string>{"b", "w"}) ++bad;
    for (std::int64_t row = 0; row < 64; ++row)
      for (std::int64_t c = lo; c < hi; ++c)
        if (w[static_cast<std::size_t>(row * (hi - lo) + c - lo)] !=
            static_cast<float>(cairn::bf16(static_cast<float>((row * 48 + c) % 512) / 8)))
          ++bad;
    for (std::size_t i = 0; i < b.size(); ++i)
      if (!(b[i] == cairn::bf16(static_cast<float>(i) / 3))) ++bad;
    if (n != std::vector<std::int32_t>(10, 7)) ++bad;
  });
  CHECK(bad.load() == 0);
  // Off (the default): the first differing key is an error that names the option.
  cairn::single_communicator one;
  std::vector<float> w(64 * 48);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(w), {64, 48}, 0));
  auto off = cairn::try_load(sd, mem, one);
  REQUIRE(!off);
  CHECK(off.err().code == cairn::errc::mismatch);
  CHECK(off.err().key == "w");
  CHECK(off.err().message.find("cast_floats") != std::string::npos);
  // On, an integer tensor still does not convert.
  std::vector<float> n(10);
  cairn::state_dict ints;
  ints.add("n", cairn::replicated("n", std::span(n), {10}, 0));
  cairn::load_options cast;
  cast.cast_floats = true;
  auto i32 = cairn::try_load(ints, mem, one, cast);
  REQUIRE(!i32);
  CHECK(i32.err().code == cairn::errc::mismatch);
  CHECK(i32.err().key == "n");
  CHECK(i32.err().message.find("only between") != std::string::npos);
}
