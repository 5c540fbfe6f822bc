// Save strategies (native, torch_dist, one_file, per_tensor, chunks): what each layout can and
// cannot hold; safety. That each saves on N ranks and loads back on M ranks element-exactly is
// the format conformance suite's (tests/format/conformance_test.cpp).
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "../api/property.hpp"
#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"

using namespace cairn_test;

namespace {

std::vector<std::string> sorted_names(cairn::memory_storage& mem) {
  auto names = mem.list("").value();
  std::sort(names.begin(), names.end());
  return names;
}

/// Counts the bytes read from data files ("data.*"), not the metadata or index reads around
/// them.
class data_read_counter : public cairn::storage_decorator<cairn::memory_storage> {
 public:
  explicit data_read_counter(cairn::memory_storage& m) : storage_decorator(m) {}
  cairn::result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    if (name.starts_with("data.")) data_bytes += out.size();
    return storage_decorator::read(name, offset, out);
  }
  std::uint64_t data_bytes_read() const { return data_bytes.load(); }
  std::atomic<std::uint64_t> data_bytes{0};
};

}  // namespace

namespace {

struct rng_state {
  std::uint64_t s[2];
};

struct train_state {
  std::vector<float> w_data;
  cairn::sharded_tensor<float> w;
  std::int32_t step = 0;
  float lr = 0;
  bool warm = false;
  std::string run;
  std::vector<std::int64_t> sched;
  cairn::sharded_object<rng_state> rng;
  static constexpr auto fields =
      cairn::field_names("", "w", "step", "lr", "warm", "run", "sched", "rng");
};

void make_state(train_state& s, int rank, int world, float seed) {
  s.w_data.resize(12 / world * 5);
  for (std::size_t i = 0; i < s.w_data.size(); ++i)
    s.w_data[i] = seed + static_cast<float>(rank * 100 + static_cast<int>(i));
  s.w = cairn::from_rank_offsets("w", std::span(s.w_data), {12 / world, 5}, {{0, rank, world}});
  s.rng = cairn::per_rank("rng", rng_state{{7u + rank, 9}}, rank, world);
}

}  // namespace

TEST_CASE("torch_dist keeps common values and sharded objects; a DCP item holds each") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 4, 1.0f);
    s.step = 123;
    s.lr = 0.25f;
    s.warm = true;
    s.run = "run-β";
    s.sched = {3, -4};
    cairn::save(s, mem, comm, so);
  });
  CHECK(mem.exists("common.pt").value());
  CHECK(mem.exists(".metadata").value());
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.format == "torch_dist");
  CHECK(m.objects.size() == 4);
  CHECK(m.inline_commons.at("step").type == cairn::dtype::i64);  // Python int in common.pt
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 0.0f);
    s.rng = cairn::per_rank("rng", rng_state{}, comm.rank(), 4);  // the saved grid
    cairn::load(s, mem, comm);
    CHECK(s.step == 123);
    CHECK(s.lr == 0.25f);
    CHECK(s.warm);
    CHECK(s.run == "run-β");
    CHECK(s.sched == std::vector<std::int64_t>{3, -4});
    CHECK(s.rng.value.s[0] == 7u + static_cast<std::uint64_t>(comm.rank()));
    for (int row = 0; row < 6; ++row)
      for (int col = 0; col < 5; ++col) {
        int grow = comm.rank() * 6 + row;
        int saved_rank = grow / 3, local = (grow % 3) * 5 + col;
        CHECK(s.w_data[row * 5 + col] == 1.0f + static_cast<float>(saved_rank * 100 + local));
      }
  });
}

namespace {
struct wide_state {
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("step");
};
struct narrow_state {
  std::int32_t step = 0;
  static constexpr auto fields = cairn::field_names("step");
};
}  // namespace

TEST_CASE("a Python value that does not fit the target's dtype fails naming the key") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::single_communicator one;
  wide_state w;
  w.step = std::int64_t{1} << 40;
  cairn::save(w, mem, one, so);
  narrow_state n;
  auto r = cairn::try_load(n, mem, one);
  REQUIRE(!r);
  CHECK(r.err().key == "step");
  CHECK(r.err().code == cairn::errc::mismatch);
  w.step = 77;                  // fits: loaded as int32
  cairn::memory_storage fresh;  // torch_dist never replaces a checkpoint in place
  cairn::save(w, fresh, one, so);
  cairn::load(n, fresh, one);
  CHECK(n.step == 77);
}

TEST_CASE("safetensors strategies hold tensors only and never replace a checkpoint in place") {
  cairn::memory_storage mem;
  cairn::safetensors_strategy one(cairn::convert::output_format::one_file);
  cairn::save_options so;
  so.strategy = &one;
  cairn::single_communicator comm;
  {
    train_state s;
    make_state(s, 0, 1, 0.0f);
    auto r = cairn::try_save(s, mem, comm, so);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "rng");
    CHECK(mem.list("").value().empty());
  }
  std::vector<float> w(6, 1.5f);
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {}));
  cairn::save(sd, mem, comm, so);
  auto first = mem.list("").value();
  CHECK(first == std::vector<std::string>{"model.safetensors"});
  so.overwrite = true;
  auto r = cairn::try_save(sd, mem, comm, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::already_exists);
  // A different layout never writes over it either.
  cairn::save_options native;
  auto n = cairn::try_save(sd, mem, comm, native);
  REQUIRE(!n);
  CHECK(n.err().code == cairn::errc::already_exists);
}

TEST_CASE("safetensors output is byte-identical for the same state on any number of ranks") {
  std::vector<std::vector<std::byte>> outputs;
  // The last run also asks for index files, a native option the strategy must not trip over
  // (its shards are written by the native writer).
  for (auto [n, index_files] : {std::pair{1, false}, std::pair{3, false}, std::pair{3, true}}) {
    cairn::memory_storage mem;
    cairn::safetensors_strategy chunks(cairn::convert::output_format::chunks, 2000);
    cairn::save_options so;
    so.strategy = &chunks;
    so.index_files = index_files;
    std::mt19937 rng(5);
    property_case c = random_case(rng,
                                  {{"a", cairn::dtype::f32, {12, 9}},
                                   {"b/c", cairn::dtype::bf16, {7}},
                                   {"d", cairn::dtype::i64, {6, 5}}},
                                  n, n);
    save_on_threads(mem, c, n, layout_kind::block, so);
    std::vector<std::byte> all;
    for (const auto& f : sorted_names(mem)) {
      auto size = mem.size(f).value();
      std::vector<std::byte> b(size);
      REQUIRE(mem.read(f, 0, b));
      all.insert(all.end(), b.begin(), b.end());
    }
    outputs.push_back(std::move(all));
  }
  CHECK(outputs[0] == outputs[1]);
  CHECK(outputs[0] == outputs[2]);
}

TEST_CASE("torch_dist never writes over a committed checkpoint; a failed save leaves nothing") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 1.0f);
    cairn::save(s, mem, comm, so);
  });
  auto before = sorted_names(mem);
  // common.pt has a fixed name: replacing it before the commit would change the committed
  // checkpoint, so overwrite is refused before anything is written.
  so.overwrite = true;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 5.0f);
    auto r = cairn::try_save(s, mem, comm, so);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::already_exists);
  });
  CHECK(sorted_names(mem) == before);
  // A save into a fresh place that fails at any write leaves nothing behind.
  for (std::uint64_t k = 0; k < 8; ++k) {
    cairn::memory_storage other;
    cairn::faulty_storage faulty(other);
    faulty.fail_after_writes(k);
    bool ok = true;
    std::mutex mu;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      train_state s;
      make_state(s, comm.rank(), 2, 5.0f);
      auto r = cairn::try_save(s, faulty, comm, so);
      std::lock_guard lock(mu);
      ok = ok && r.has_value();
    });
    if (ok) break;  // k was past the last write
    INFO("failing write " << k);
    CHECK(sorted_names(other).empty());
  }
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(4 * 5);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4, 5}, {{0, comm.rank(), 3}}));
    cairn::load(sd, mem, comm);
    CHECK(w[0] ==
          1.0f + static_cast<float>((comm.rank() * 4 / 6) * 100 + (comm.rank() * 4 % 6) * 5));
  });
}

namespace {

/// A (rows, 256) i64 tensor of small counters (compresses well), rank r of `world` holding a
/// row block; the data views `buf`.
cairn::sharded_tensor<std::int64_t> counters(std::vector<std::int64_t>& buf,
                                             std::int64_t rows,
                                             int r,
                                             int world) {
  std::int64_t lo = rows * r / world, hi = rows * (r + 1) / world;
  buf.resize(static_cast<std::size_t>((hi - lo) * 256));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(buf.size()); ++i)
    buf[static_cast<std::size_t>(i)] = (lo * 256 + i) % 97;
  cairn::sharded_tensor<std::int64_t> t;
  t.key = "counters";
  t.type = cairn::dtype::i64;
  t.local_shape = {hi - lo, 256};
  t.global_shape = {rows, 256};
  t.global_offset = {lo, 0};
  t.data = buf;
  return t;
}

}  // namespace

TEST_CASE("zstd: compressed blocks, tiled or not, load on another topology and verify") {
  for (int variant = 0; variant < 4; ++variant) {
    const bool tile = variant % 2 == 0, index_files = variant < 2;
    INFO("tile " << tile << " index_files " << index_files);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.zstd_level = 3;
    so.block_size = 16 << 10;
    so.tile = tile;
    so.index_files = index_files;
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> buf;
      cairn::state_dict sd;
      sd.add("c", counters(buf, 256, comm.rank(), 4));
      sd.add("step", std::int64_t{5});
      cairn::save(sd, mem, comm, so);
    });
    auto m = cairn::read_metadata(mem).value();
    CHECK(m.version == (index_files ? 4 : 3));
    const auto& t = m.tensors.at("counters");
    CHECK(t.stored_bytes() * 4 < t.chunk_bytes());  // i64 counters below 97 shrink a lot
    std::uint64_t files = 0;
    for (const auto& f : m.files)
      if (f.name.starts_with("data.")) files += mem.size(f.name).value();
    CHECK(files * 4 < t.nbytes());
    CHECK(cairn::verify_checkpoint(mem).value().empty());
    // Load on 3 ranks; a counting storage shows only the needed blocks are read.
    data_read_counter counting(mem);
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> want;
      auto w = counters(want, 256, comm.rank(), 3);
      std::vector<std::int64_t> got(want.size(), -1);
      auto g = w;
      g.data = got;
      cairn::state_dict sd;
      sd.add("c", g);
      cairn::load(sd, counting, comm);
      CHECK(got == want);
    });
    // Each stored block is read about once (blocks on a rank boundary by both ranks).
    CHECK(counting.data_bytes_read() < files + files / 4);
    // Load one row: reads a block or two, not the tensor.
    counting.data_bytes = 0;
    {
      std::vector<std::int64_t> row(256, -1);
      cairn::sharded_tensor<std::int64_t> r1;
      r1.key = "counters";
      r1.type = cairn::dtype::i64;
      r1.local_shape = {1, 256};
      r1.global_shape = {256, 256};
      r1.global_offset = {100, 0};
      r1.data = row;
      cairn::state_dict sd;
      sd.add("c", r1);
      cairn::single_communicator one;
      cairn::load(sd, counting, one);
      for (int i = 0; i < 256; ++i) CHECK(row[static_cast<std::size_t>(i)] == (100 * 256 + i) % 97);
      CHECK(counting.data_bytes_read() < t.stored_bytes() / 8);
    }
  }
}

TEST_CASE("zstd: a corrupted compressed block fails load and verify naming key and offset") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.zstd_level = 1;
  so.block_size = 8 << 10;
  std::vector<std::int64_t> buf;
  cairn::state_dict sd;
  sd.add("c", counters(buf, 64, 0, 1));
  cairn::single_communicator one;
  cairn::save(sd, mem, one, so);
  auto m = cairn::read_metadata(mem).value();
  const auto& c = m.tensors.at("counters").chunks.at(1);
  REQUIRE(c.where.compressed());
  REQUIRE(c.where.block_stored[0] < so.block_size);
  const std::string& file = m.files.at(c.where.file).name;
  std::uint64_t at = c.where.block_offsets[0] + c.where.block_stored[0] / 2;
  std::vector<std::byte> all(mem.size(file).value());
  mem.read(file, 0, all).value();
  all[at] ^= std::byte{0x5a};
  mem.put(file, all).value();
  auto problems = cairn::verify_checkpoint(mem).value();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].err.key == "counters");
  CHECK(problems[0].err.code == cairn::errc::corrupt);
  CHECK(problems[0].err.offset == c.where.block_offsets[0]);
  std::vector<std::int64_t> back(buf.size());
  auto t = counters(buf, 64, 0, 1);
  t.data = back;
  cairn::state_dict target;
  target.add("c", t);
  auto r = cairn::try_load(target, mem, one);
  REQUIRE(!r);
  CHECK(r.err().key == "counters");
  CHECK(r.err().code == cairn::errc::corrupt);
}

TEST_CASE("zstd_level out of range is refused before anything is written") {
  cairn::memory_storage mem;
  cairn::save_options so;
  so.zstd_level = 99;
  std::vector<std::int64_t> buf;
  cairn::state_dict sd;
  sd.add("c", counters(buf, 4, 0, 1));
  cairn::single_communicator one;
  auto r = cairn::try_save(sd, mem, one, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(mem.list("").value().empty());
}

TEST_CASE("async_saver writes every strategy in the background; the result loads on M ranks") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy chunks(cairn::convert::output_format::chunks, 700);
  for (const cairn::save_strategy* strategy :
       {static_cast<const cairn::save_strategy*>(&torch_dist),
        static_cast<const cairn::save_strategy*>(&chunks)}) {
    INFO(strategy->name());
    cairn::memory_storage mem;
    std::mt19937 rng(11);
    property_case c = random_case(
        rng, {{"a", cairn::dtype::f32, {12, 9}}, {"b", cairn::dtype::bf16, {7, 4}}}, 3, 2);
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      cairn::async_saver saver;
      rank_state rs;
      build_rank(rs, c.specs, c.save_grids, comm.rank(), 3, true);
      auto h = saver.save(rs.sd, mem, comm, so);
      REQUIRE(h);
      for (auto& b : rs.buffers) std::fill(b.begin(), b.end(), std::byte{0x11});  // staged
      REQUIRE(h->wait());
    });
    CHECK(load_failures_on_threads(mem, c, 2, layout_kind::block).empty());
  }
}

namespace {

/// A user-written strategy: the native layout, plus a `MANIFEST` of every data file that
/// rank 0 writes just before the commit (what an orchestration system might wait for).
class manifest_strategy final : public cairn::save_strategy {
 public:
  std::string_view name() const noexcept override { return "native+manifest"; }
  bool tiles(const cairn::save_options& opt) const noexcept override { return native_.tiles(opt); }
  cairn::result<void> write(cairn::planned_save& plan,
                            cairn::storage_ref st,
                            const cairn::save_options& opt,
                            cairn::buffer_pool* buffers,
                            cairn::written_save& out) const override {
    return native_.write(plan, st, opt, buffers, out);
  }
  cairn::result<void> commit(cairn::planned_save& plan,
                             cairn::written_save& w,
                             const std::vector<cairn::bytes>& reports,
                             const std::vector<cairn::bytes>& assembled,
                             cairn::storage_ref st,
                             const cairn::save_options& opt) const override {
    std::string manifest;
    for (const auto& f :
         cairn::native_strategy::metadata_of(plan.index, plan.save_id, reports).files)
      manifest += f.name + " rank " + std::to_string(f.rank) + "\n";
    CAIRN_TRY(st.put("MANIFEST", std::as_bytes(std::span(manifest))));
    return native_.commit(plan, w, reports, assembled, st, opt);
  }
  void abandon(const cairn::planned_save& plan,
               const cairn::written_save& w,
               cairn::storage_ref st) const override {
    native_.abandon(plan, w, st);
  }

 private:
  cairn::native_strategy native_;
};

}  // namespace

TEST_CASE("a user-written strategy plugs into save; the checkpoint loads as usual") {
  cairn::memory_storage mem;
  manifest_strategy mine;
  cairn::save_options so;
  so.strategy = &mine;
  std::mt19937 rng(3);
  property_case c = random_case(rng, {{"w", cairn::dtype::f32, {8, 6}}}, 3, 2);
  save_on_threads(mem, c, 3, layout_kind::block, so);
  std::vector<std::byte> manifest(mem.size("MANIFEST").value());
  mem.read("MANIFEST", 0, manifest).value();
  std::string text(reinterpret_cast<const char*>(manifest.data()), manifest.size());
  CHECK(text.find(".cairn rank ") != std::string::npos);
  CHECK(load_failures_on_threads(mem, c, 2, layout_kind::block).empty());
}

TEST_CASE("scalable planning refuses a strategy that needs the whole index") {
  cairn::memory_storage mem;
  const cairn::torch_dist_strategy torch_dist;
  cairn::save_options so;
  so.scalable_planning = true;
  so.strategy = &torch_dist;
  cairn::state_dict sd;
  sd.add("step", std::int64_t{1});
  cairn::single_communicator one;
  auto r = cairn::try_save(sd, mem, one, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(r.err().message.find("torch_dist") != std::string::npos);
}

TEST_CASE("verify_any: checksums for native, layout and every byte for DCP and safetensors") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::convert::output_format::one_file);
  const std::pair<const char*, const cairn::save_strategy*> cases[] = {
      {"cairn", nullptr}, {"torch_dist", &torch_dist}, {"safetensors", &one_file}};
  for (auto [format, strategy] : cases) {
    CAPTURE(format);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> buf;
      cairn::state_dict sd;
      sd.add("c", counters(buf, 64, comm.rank(), 2));
      cairn::save(sd, mem, comm, so);
    });
    auto report = cairn::verify_any(mem).value();
    CHECK(report.format == format);
    CHECK(report.checksummed == (strategy == nullptr));
    CHECK(report.problems.empty());
    // Cut the last 8 bytes off the largest data file: every layout finds it.
    std::string biggest;
    std::uint64_t most = 0;
    for (const auto& n : mem.list("").value()) {
      const std::uint64_t size = mem.size(n).value();
      const bool data =
          n.ends_with(".distcp") || n.ends_with(".safetensors") || n.starts_with("data.");
      if (data && size > most) most = size, biggest = n;
    }
    REQUIRE(!biggest.empty());
    std::vector<std::byte> bytes(most - 8);
    REQUIRE(mem.read(biggest, 0, bytes));
    REQUIRE(mem.put(biggest, bytes));
    auto cut = cairn::verify_any(mem);
    if (cut) {
      REQUIRE(!cut->problems.empty());
      CHECK(cut->problems.front().err.file.find(biggest) != std::string::npos);
    } else {
      CHECK(cut.err().code == cairn::errc::corrupt);  // safetensors: its reader refuses it
    }
  }
}

TEST_CASE("diff: added, removed, retyped, reshaped and changed tensors, across layouts") {
  auto save = [](cairn::memory_storage& mem, const cairn::save_strategy* strategy, float bump,
                 bool variant) {
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<float> w(32 * 8);
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(comm.rank() * 1000 + static_cast<int>(i));
      if (comm.rank() == 1) w[5] += bump;  // one element of rank 1's rows
      std::vector<std::int32_t> ids(10, 7);
      std::vector<double> wide(6, 1.0);
      cairn::state_dict sd;
      sd.add("w", cairn::from_rank_offsets("w", std::span(w), {32, 8}, {{0, comm.rank(), 2}}));
      sd.add("ids", cairn::replicated("ids", std::span(ids), {10}, comm.rank()));
      if (variant) {
        std::vector<float> narrow(6, 1.0f);
        sd.add("wide", cairn::replicated("wide", std::span(narrow), {6}, comm.rank()));
        std::vector<std::int32_t> more(12, 1);
        sd.add("more", cairn::replicated("more", std::span(more), {12}, comm.rank()));
        cairn::save(sd, mem, comm, so);
      } else {
        sd.add("wide", cairn::replicated("wide", std::span(wide), {6}, comm.rank()));
        std::vector<std::int32_t> gone(3, 1);
        sd.add("gone", cairn::replicated("gone", std::span(gone), {3}, comm.rank()));
        cairn::save(sd, mem, comm, so);
      }
    });
  };
  const cairn::torch_dist_strategy torch_dist;
  cairn::memory_storage a, same_dcp, b;
  save(a, nullptr, 0.0f, false);
  save(same_dcp, &torch_dist, 0.0f, false);
  save(b, nullptr, 0.25f, true);
  auto src_a = cairn::convert::open_source(a).value();
  auto src_same = cairn::convert::open_source(same_dcp).value();
  auto src_b = cairn::convert::open_source(b).value();
  // The same tensors in two layouts: no difference, read in slabs of 64 bytes.
  auto none = cairn::convert::diff(*src_a, *src_same, 64).value();
  CHECK(none.same());
  CHECK(none.compared == 4);
  CHECK(none.bytes_compared == 64 * 8 * 4 + 10 * 4 + 6 * 8 + 3 * 4);  // w is [64, 8]
  auto d = cairn::convert::diff(*src_a, *src_b, 64).value();
  using change = cairn::convert::tensor_diff::change;
  REQUIRE(d.tensors.size() == 4);
  CHECK(d.tensors[0].key == "gone");
  CHECK(d.tensors[0].what == change::removed);
  CHECK(d.tensors[1].key == "more");
  CHECK(d.tensors[1].what == change::added);
  CHECK(d.tensors[1].shape_b == cairn::shape{12});
  CHECK(d.tensors[2].key == "w");
  CHECK(d.tensors[2].what == change::values);
  CHECK(d.tensors[2].differing == 1);
  CHECK(d.tensors[2].max_abs == doctest::Approx(0.25).epsilon(1e-3));
  CHECK(d.tensors[3].key == "wide");
  CHECK(d.tensors[3].what == change::dtype);
  CHECK(d.tensors[3].type_a == cairn::dtype::f64);
  CHECK(d.tensors[3].type_b == cairn::dtype::f32);
  CHECK(d.compared == 2);  // ids and w
}
