// Golden checkpoints: every layout cairn writes, saved once from a fixed state on 2 ranks and
// committed under tests/system/golden/data/<format>/. Each must keep loading to the same values on
// any number of ranks, and saving the same state again must give byte-identical files (save ids
// aside), so a refactoring of the pipeline cannot change the formats unnoticed.
//
// CAIRN_GOLDEN_WRITE=1 build/bin/test_golden rewrites the fixtures (CAIRN_GOLDEN_WRITE=<name> only
// that one); do that only for an intended format change, and say so in the commit. A layout a
// newer version replaced (version 4's index files) stays pinned: loaded, never rewritten.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/source_dir.hpp"

namespace {

namespace fs = std::filesystem;
constexpr int saved_world = 2;

/// One rank's state. `objects` (per-rank RNG bytes and a common step) only for layouts that
/// hold them. Values depend on the global index only (`fill`), or are zero to be loaded into.
struct golden_state {
  std::vector<float> w;           // [6, 5] f32, rows split
  std::vector<cairn::bf16> e;     // [4, 6] bf16, columns split
  std::vector<std::int64_t> b;    // [7] i64, replicated
  std::vector<std::int32_t> big;  // [40, 8] i32, rows split: larger than the small blocks
  std::vector<float> u;           // [5, 3] f32, rows split unevenly (not a grid), if `uneven`
  cairn::state_dict sd;

  golden_state(int rank, int world, bool fill, bool objects, bool uneven = false) {
    auto split = [&](std::int64_t n) {
      return std::pair{n * rank / world, n * (rank + 1) / world};
    };
    auto [w0, w1] = split(6);
    w.resize(static_cast<std::size_t>((w1 - w0) * 5));
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = fill ? 0.25f * static_cast<float>(w0 * 5 + static_cast<std::int64_t>(i)) : 0.0f;
    sd.add("model.w", cairn::block("model.w", std::span(w), {w1 - w0, 5}, {6, 5}, {w0, 0}));
    auto [e0, e1] = split(6);
    e.resize(static_cast<std::size_t>(4 * (e1 - e0)));
    for (std::int64_t r = 0; r < 4; ++r)
      for (std::int64_t c = e0; c < e1; ++c)
        e[static_cast<std::size_t>(r * (e1 - e0) + c - e0)] =
            cairn::bf16(fill ? static_cast<float>(r * 6 + c) - 7.5f : 0.0f);
    sd.add("model.e", cairn::block("model.e", std::span(e), {4, e1 - e0}, {4, 6}, {0, e0}));
    b.resize(7);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = fill ? (std::int64_t{1} << 40) + static_cast<std::int64_t>(i) : 0;
    sd.add("model.b", cairn::replicated("model.b", std::span(b), {7}, rank));
    auto [g0, g1] = split(40);
    big.resize(static_cast<std::size_t>((g1 - g0) * 8));
    for (std::size_t i = 0; i < big.size(); ++i)
      big[i] = fill ? static_cast<std::int32_t>((g0 * 8 + static_cast<std::int64_t>(i)) % 13) : 0;
    sd.add("optim.big", cairn::block("optim.big", std::span(big), {g1 - g0, 8}, {40, 8}, {g0, 0}));
    if (uneven) {
      auto [u0, u1] = split(5);
      u.resize(static_cast<std::size_t>((u1 - u0) * 3));
      for (std::size_t i = 0; i < u.size(); ++i)
        u[i] = fill ? -0.5f * static_cast<float>(u0 * 3 + static_cast<std::int64_t>(i)) : 0.0f;
      sd.add("model.u", cairn::block("model.u", std::span(u), {u1 - u0, 3}, {5, 3}, {u0, 0}));
    }
    if (objects) {
      std::vector<std::byte> rng;
      if (fill)
        for (int i = 0; i < 5; ++i) rng.push_back(std::byte(rank * 16 + i));
      sd.add("rng", cairn::byte_object{"rng", rng, {world}, {rank}, 0});
      sd.add("step", std::int64_t{fill ? 1234 : 0});
    }
  }

  /// Whether this rank (of `world`) holds exactly what the full state holds at its places.
  bool matches(int rank, int world, bool objects, bool uneven) const {
    golden_state want(rank, world, true, objects, uneven);
    if (w != want.w || b != want.b || big != want.big || u != want.u) return false;
    for (std::size_t i = 0; i < e.size(); ++i)
      if (static_cast<float>(e[i]) != static_cast<float>(want.e[i])) return false;
    if (!objects) return true;
    // The object this rank loads: the one saved rank `rank % saved_world` held.
    const golden_state saver(rank % saved_world, saved_world, true, true);
    const auto& rng = std::get<cairn::byte_object>(*sd.find("rng")).value;
    const auto& want_rng = std::get<cairn::byte_object>(*saver.sd.find("rng")).value;
    return rng == want_rng &&
           std::get<cairn::common_value>(*sd.find("step")).as<std::int64_t>() == 1234;
  }
};

/// A golden format: its folder name, how it is saved, whether it holds objects, whether it
/// holds an unevenly split tensor, and whether this build still writes it (a format replaced by
/// a newer version stays pinned: loaded, never rewritten).
struct golden_format {
  std::string name;
  cairn::save_options options;
  bool objects = true;
  bool uneven = false;
  bool written = true;
};

const cairn::torch_dist_strategy torch_dist;
const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
const cairn::safetensors_strategy per_tensor(cairn::safetensors::file_split::per_tensor);
const cairn::safetensors_strategy chunks(cairn::safetensors::file_split::chunks, 600);

std::vector<golden_format> formats() {
  std::vector<golden_format> out;
  cairn::save_options plain;
  plain.index_files = false;  // versions 1-3 stay pinned: their layouts must not change
  plain.tile = false;
  out.push_back({"native_plain", plain});
  cairn::save_options tiled;
  tiled.index_files = false;
  tiled.block_size = 64;  // version 2: chunks cut into tiles
  out.push_back({"native_tiled", tiled});
  cairn::save_options zstd;
  zstd.index_files = false;
  zstd.block_size = 64;
  zstd.zstd_level = 3;  // version 3
  zstd.io_threads = 1;  // compressed blocks are appended as they finish: one thread, one order
  out.push_back({"native_zstd", zstd});
  cairn::save_options index = tiled;
  index.index_files = true;  // version 4: a manifest and index files, written before grids
  out.push_back({"native_index", index, true, false, false});
  // version 5: index files with grid directories (and pages for the uneven tensor); both
  // index fixtures are read by the reader in docs/format.md
  out.push_back({"native_grid", index, true, true});
  cairn::save_options td;
  td.strategy = &torch_dist;
  out.push_back({"torch_dist", td});
  for (const cairn::safetensors_strategy* s : {&one_file, &per_tensor, &chunks}) {
    cairn::save_options o;
    o.strategy = s;
    out.push_back({"safetensors_" + std::string(s->name()), o, false});
  }
  return out;
}

/// Every file of a storage, by name.
std::map<std::string, std::string> files_of(cairn::storage_ref st) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> names = st.list("").value();  // not a temporary's member
  for (const auto& n : names) {
    std::string bytes(st.size(n).value(), '\0');
    REQUIRE(st.read(n, 0, std::as_writable_bytes(std::span(bytes))));
    out[n] = std::move(bytes);
  }
  return out;
}

/// The save id in a checkpoint's file names (native `data.<r>.<id>.cairn`, DCP
/// `__<r>_0.<id>.distcp`), or "" (safetensors has none).
std::string save_id_of(const std::map<std::string, std::string>& files) {
  for (const auto& [n, b] : files) {
    for (std::string_view suffix : {std::string_view(".cairn"), std::string_view(".distcp")}) {
      if (!n.ends_with(suffix)) continue;
      std::string stem = n.substr(0, n.size() - suffix.size());
      return stem.substr(stem.rfind('.') + 1);
    }
  }
  return {};
}

/// Files with their save id replaced by zeros in names and contents (and metadata.json
/// resealed), so two saves of the same state compare byte for byte.
std::map<std::string, std::string> normalized(const std::map<std::string, std::string>& files) {
  const std::string id = save_id_of(files);
  auto replace = [&](std::string s) {
    if (id.empty()) return s;
    const std::string zeros(id.size(), '0');
    for (std::size_t at = s.find(id); at != std::string::npos; at = s.find(id, at + id.size()))
      s.replace(at, id.size(), zeros);
    return s;
  };
  std::map<std::string, std::string> out;
  for (const auto& [n, b] : files) {
    std::string body = replace(b);
    if (n == "metadata.json" && body.find("\"format\":\"cairn\"") != std::string::npos)
      body = cairn::reseal_metadata_json(body);
    out[replace(n)] = std::move(body);
  }
  return out;
}

void save_golden(cairn::storage_ref st, const golden_format& f) {
  cairn::run_ranks(saved_world, [&](cairn::thread_communicator& comm) {
    golden_state s(comm.rank(), saved_world, true, f.objects, f.uneven);
    cairn::save(s.sd, st, comm, f.options);
  });
}

}  // namespace

TEST_CASE("golden checkpoints of every format load and re-save identically") {
  const fs::path root = fs::path(cairn_test::source_dir()) / "tests/system/golden/data";
  const char* write_env = std::getenv("CAIRN_GOLDEN_WRITE");
  const std::string write_only = write_env ? write_env : "";
  for (const golden_format& f : formats()) {
    CAPTURE(f.name);
    const fs::path dir = root / f.name;
    if (write_env && f.written && (write_only == "1" || write_only == f.name)) {
      fs::remove_all(dir);
      cairn::file_storage disk(dir);
      save_golden(disk, f);
      MESSAGE("wrote " << dir.string());
      continue;
    }
    REQUIRE(fs::is_directory(dir));
    cairn::file_storage golden(dir);
    // It loads, on the saved number of ranks and on others.
    for (int world : {1, 2, 3}) {
      CAPTURE(world);
      std::mutex mu;
      std::vector<std::string> outcome;
      cairn::load_options lo;
      lo.object_mapping = cairn::objects_modulo();
      cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
        golden_state s(comm.rank(), world, false, f.objects, f.uneven);
        auto r = cairn::try_load(s.sd, golden, comm, lo);
        std::string what = !r                                                   ? r.err().describe()
                           : s.matches(comm.rank(), world, f.objects, f.uneven) ? "exact"
                                                                                : "other values";
        std::lock_guard lock(mu);
        outcome.push_back(std::move(what));
      });
      for (const auto& o : outcome) CHECK(o == "exact");
    }
    if (!f.written) continue;
    // The same state saved again gives the same files.
    cairn::memory_storage again;
    save_golden(again, f);
    auto want = normalized(files_of(golden));
    auto got = normalized(files_of(again));
    std::vector<std::string> want_names, got_names;
    for (const auto& [n, b] : want) want_names.push_back(n);
    for (const auto& [n, b] : got) got_names.push_back(n);
    REQUIRE(got_names == want_names);
    for (const auto& [n, b] : want) {
      CAPTURE(n);
      CHECK(got.at(n) == b);
    }
  }
}
