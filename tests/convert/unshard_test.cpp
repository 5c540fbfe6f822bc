// unshard / convert / consolidate: a checkpoint saved on 4 thread ranks (row, column, uneven
// and flattened distributed-optimizer shards, replicas, a scalar) consolidated into each
// strategy and compared element-exactly; chunk limits, determinism, dtype conversion, and a
// DCP source.
#include "cairn/convert/unshard.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "tests/support/filled_block.hpp"
#include "tests/support/test_util.hpp"

namespace {
using cairn::box;
using cairn::dtype;
using cairn::shape;
namespace cv = cairn::convert;
namespace fs = std::filesystem;

struct spec {
  std::string key;
  dtype type;
  shape global;
};

const std::vector<spec> kSpecs = {
    {"model.row", dtype::f32, {16, 6}},     {"model.col", dtype::bf16, {5, 8}},
    {"optim.exp_avg", dtype::f32, {10, 7}}, {"model.ids", dtype::i64, {9}},
    {"model.scale", dtype::f64, {}},        {"model.f16", dtype::f16, {3, 4, 5}},
    {"model.mask", dtype::bool_, {7, 3}},   {"optim.exp_avg_sq", dtype::f64, {6, 5}},
};

std::vector<std::byte> whole(const spec& s) {
  return cairn_test::filled_whole(s.key, s.type, s.global);
}

/// Saves kSpecs on 4 thread ranks, each tensor sharded its own way.
void save_multirank(cairn::storage_ref st) {
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<std::byte>> bufs(kSpecs.size());
    cairn::state_dict sd;
    for (std::size_t i = 0; i < kSpecs.size(); ++i) {
      const spec& s = kSpecs[i];
      cairn::sharded_tensor<> t;
      t.key = s.key;
      t.type = s.type;
      t.global_shape = s.global;
      box b{shape(s.global.size(), 0), s.global};
      if (s.key == "model.row") {
        b.offset[0] = 4 * r, b.size[0] = 4;
      } else if (s.key == "model.col") {
        b.offset[1] = 2 * r, b.size[1] = 2;
      } else if (s.key == "model.f16") {
        b.offset[1] = r, b.size[1] = 1;
      } else if (s.key == "model.mask") {
        const std::int64_t cuts[] = {0, 2, 4, 6, 7};
        b.offset[0] = cuts[r], b.size[0] = cuts[r + 1] - cuts[r];
      } else {
        t.replica_id = r;  // replicated unless flattened below
      }
      t.local_shape = b.size;
      t.global_offset = b.offset;
      std::vector<std::byte> blk = cairn_test::filled_block(s.key, s.type, s.global, b);
      if (s.key.rfind("optim.", 0) == 0) {  // distributed optimizer: flat slices of the whole
        std::int64_t v = b.volume(), lo = v * r / 4, hi = v * (r + 1) / 4;
        t.flattened_range = cairn::flat_range{lo, hi};
        t.replica_id = 0;
        bufs[i] = cairn_test::flat_slice(blk, cairn::dtype_size(s.type), *t.flattened_range);
      } else {
        bufs[i] = std::move(blk);
      }
      t.data = bufs[i];
      sd.add(s.key, t);
    }
    sd.add("step", std::int64_t{12});
    cairn::save_options so;
    so.block_size = 64;
    so.content_metadata = {{"model", "convert-test"}, {"tp", "4"}};
    cairn::save(sd, st, comm, so);
  });
}

std::vector<std::byte> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

/// Reads tensor `key` from the safetensors output in `dir` (through the index when present).
std::pair<cairn::safetensors::tensor_info, std::vector<std::byte>> read_out(
    cairn::file_storage& st, const std::string& file, const std::string& key) {
  auto h = cairn::safetensors::read_header(st, file).value();
  const auto* t = h.find(key);
  REQUIRE_MESSAGE(t, key << " in " << file);
  std::vector<std::byte> b(t->nbytes());
  cairn::safetensors::read_tensor(st, file, h, key, b).value();
  return {*t, b};
}

void check_all(cairn::file_storage& st, const std::map<std::string, std::string>& where) {
  for (const auto& s : kSpecs) {
    INFO(s.key);
    REQUIRE(where.count(s.key));
    auto [info, bytes] = read_out(st, where.at(s.key), s.key);
    CHECK(info.type == s.type);
    CHECK(info.dims == s.global);
    CHECK(bytes == whole(s));
  }
}

std::map<std::string, std::string> all_in(const std::string& file) {
  std::map<std::string, std::string> m;
  for (const auto& s : kSpecs) m[s.key] = file;
  return m;
}

}  // namespace

TEST_CASE("unshard one_file: a 4-rank checkpoint with flattened optimizer shards, exact") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_multirank(ck);
  auto src = cv::open_source(ck).value();
  CHECK(src->kind() == "cairn");
  CHECK(src->tensors().size() == kSpecs.size());
  cv::convert_options opt;
  opt.slab_bytes = 40;  // many slabs, sub-row slabs, batches across tensors
  std::uint64_t last = 0, calls = 0;
  opt.progress = [&](const cairn::progress_report& p) {
    CHECK(p.stage == "convert");
    CHECK(p.done >= last);
    CHECK(p.done <= p.total);
    last = p.done;
    ++calls;
  };
  auto stats = cv::unshard(*src, out, opt).value();
  CHECK(stats.files == std::vector<std::string>{"model.safetensors"});
  CHECK(stats.tensors == kSpecs.size());
  CHECK(calls > 10);
  CHECK(stats.skipped == std::vector<std::string>{"step"});
  check_all(out, all_in("model.safetensors"));
  auto h = cairn::safetensors::read_header(out, "model.safetensors").value();
  // The checkpoint's content metadata rides along; "format" stays safetensors' own.
  CHECK(h.metadata == std::map<std::string, std::string>{
                          {"format", "pt"}, {"model", "convert-test"}, {"tp", "4"}});
}

TEST_CASE("unshard per_tensor and chunks write an index, chunks respect the byte limit") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt");
  save_multirank(ck);
  auto src = cv::open_source(ck).value();
  SUBCASE("per_tensor") {
    cairn::file_storage out(d.path / "pt");
    cv::convert_options opt;
    opt.format = cv::output_format::per_tensor;
    auto stats = cv::unshard(*src, out, opt).value();
    CHECK(stats.files.size() == kSpecs.size() + 1);
    auto ix = cairn::safetensors::read_index(out, cairn::safetensors::index_name).value();
    CHECK(ix.weight_map.at("model.row") == "model.row.safetensors");
    check_all(out, ix.weight_map);
  }
  SUBCASE("chunks") {
    cairn::file_storage out(d.path / "chunks");
    cv::convert_options opt;
    opt.format = cv::output_format::chunks;
    opt.chunk_size = 400;
    opt.slab_bytes = 64;
    cv::unshard(*src, out, opt).value();
    auto ix = cairn::safetensors::read_index(out, cairn::safetensors::index_name).value();
    check_all(out, ix.weight_map);
    std::uint64_t total = 0;
    for (const auto& s : kSpecs) total += whole(s).size();
    CHECK(ix.total_size == total);
    std::set<std::string> files;
    for (const auto& [k, f] : ix.weight_map) files.insert(f);
    CHECK(files.size() > 2);
    for (const auto& f : files) {
      INFO(f);
      CHECK(f.find("-of-0000" + std::to_string(files.size()) + ".safetensors") !=
            std::string::npos);
      auto h = cairn::safetensors::read_header(out, f).value();
      std::uint64_t bytes = 0;
      for (const auto& t : h.tensors) bytes += t.nbytes();
      CHECK((bytes <= opt.chunk_size || h.tensors.size() == 1));
    }
    // Greedy in key order: adding the next key's first tensor would have crossed the limit.
    std::vector<std::string> ordered(files.begin(), files.end());
    for (std::size_t i = 0; i + 1 < ordered.size(); ++i) {
      auto a = cairn::safetensors::read_header(out, ordered[i]).value();
      auto b = cairn::safetensors::read_header(out, ordered[i + 1]).value();
      std::uint64_t bytes = 0;
      for (const auto& t : a.tensors) bytes += t.nbytes();
      std::string first_next;
      for (const auto& t : b.tensors)
        if (first_next.empty() || t.name < first_next) first_next = t.name;
      CHECK(bytes + b.find(first_next)->nbytes() > opt.chunk_size);
    }
  }
}

TEST_CASE("unshard output is deterministic: same checkpoint, byte-identical files") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt");
  save_multirank(ck);
  for (auto format :
       {cv::output_format::one_file, cv::output_format::chunks, cv::output_format::torch_dist}) {
    INFO(cv::format_name(format));
    std::vector<fs::path> dirs;
    for (int run = 0; run < 2; ++run) {
      dirs.push_back(d.path / (std::string(cv::format_name(format)) + std::to_string(run)));
      cairn::file_storage out(dirs.back());
      auto src = cv::open_source(ck).value();
      cv::convert_options opt;
      opt.format = format;
      opt.chunk_size = 300;
      opt.slab_bytes = 96;
      cv::convert(*src, out, opt).value();
    }
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(dirs[0])) {
      CHECK(file_bytes(e.path()) == file_bytes(dirs[1] / e.path().filename()));
      ++n;
    }
    CHECK(n == static_cast<std::size_t>(std::distance(fs::directory_iterator(dirs[1]), {})));
    CHECK(n > 0);
  }
}

TEST_CASE("unshard --dtype converts floating tensors, keeps the others") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_multirank(ck);
  auto src = cv::open_source(ck).value();
  cv::convert_options opt;
  opt.to_dtype = dtype::f32;
  opt.slab_bytes = 48;
  cv::unshard(*src, out, opt).value();
  auto consolidated = cv::consolidate(*src, dtype::f32).value();
  for (const auto& s : kSpecs) {
    INFO(s.key);
    auto [info, bytes] = read_out(out, "model.safetensors", s.key);
    auto src_bytes = whole(s);
    std::int64_t n = cairn::numel(s.global);
    if (!cv::convertible_float(s.type)) {
      CHECK(info.type == s.type);
      CHECK(bytes == src_bytes);
    } else {
      CHECK(info.type == dtype::f32);
      REQUIRE(bytes.size() == static_cast<std::size_t>(n) * 4);
      bool same = true;
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint32_t want = 0;
        if (s.type == dtype::bf16) {  // exact: the bf16 bits are the top half
          std::uint16_t h;
          std::memcpy(&h, src_bytes.data() + i * 2, 2);
          want = static_cast<std::uint32_t>(h) << 16;
        } else if (s.type == dtype::f16) {
          std::uint16_t h;
          std::memcpy(&h, src_bytes.data() + i * 2, 2);
          want = std::bit_cast<std::uint32_t>(cairn::f16::to_float(h));
        } else if (s.type == dtype::f64) {
          double v;
          std::memcpy(&v, src_bytes.data() + i * 8, 8);
          want = std::bit_cast<std::uint32_t>(static_cast<float>(v));
        } else {
          std::memcpy(&want, src_bytes.data() + i * 4, 4);
        }
        std::uint32_t got;
        std::memcpy(&got, bytes.data() + i * 4, 4);
        same &= got == want;
      }
      CHECK(same);
    }
    // consolidate returns the same tensors in memory
    const auto& c = consolidated.at(s.key);
    CHECK(c.type == info.type);
    CHECK(c.global_shape == s.global);
    CHECK(c.data == bytes);
  }
  cv::convert_options bad;
  bad.to_dtype = dtype::i32;
  CHECK(cv::unshard(*src, out, bad).err().code == cairn::errc::invalid_argument);
}

TEST_CASE("convert torch_dist writes DCP + Megatron files that read back as a DCP source") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), dist(d.path / "dist"), out(d.path / "out");
  save_multirank(ck);
  auto src = cv::open_source(ck).value();
  cv::convert_options opt;
  opt.format = cv::output_format::torch_dist;
  opt.slab_bytes = 56;  // several DCP items per tensor
  auto stats = cv::convert(*src, dist, opt).value();
  CHECK(stats.files ==
        std::vector<std::string>{"__0_0.distcp", "common.pt", "metadata.json", ".metadata"});
  auto mj = file_bytes(d.path / "dist" / "metadata.json");
  CHECK(std::string(reinterpret_cast<const char*>(mj.data()), mj.size())
            .find("\"sharded_backend\": \"torch_dist\"") != std::string::npos);
  auto common = cairn::torch_zip::open_archive(dist, "common.pt").value();
  REQUIRE(common.root.is_dict());
  CHECK(common.root.get("step")->i == 12);

  auto dcp = cv::open_source(dist).value();
  CHECK(dcp->kind() == "torch_dist");
  const auto& md = static_cast<cv::dcp_source&>(*dcp).metadata();
  CHECK(std::get<cairn::dcp::tensor_meta>(md.state_dict_metadata.at("model.row")).chunks.size() >
        3);
  // Whole tensors, and a box that crosses DCP items and cuts them.
  for (const auto& s : kSpecs) {
    INFO(s.key);
    const auto* t = dcp->find(s.key);
    REQUIRE(t);
    CHECK(t->type == s.type);
    CHECK(t->global_shape == s.global);
  }
  std::vector<std::byte> part(3 * 4 * 4);
  box b{{5, 1}, {3, 4}};
  dcp->read_box("model.row", b, part).value();
  std::vector<std::byte> want(part.size());
  cairn_test::fill_block("model.row", dtype::f32, {16, 6}, b, want.data());
  CHECK(part == want);
  // unshard from the DCP source gives the same tensors.
  cv::convert_options o2;
  o2.slab_bytes = 72;
  cv::unshard(*dcp, out, o2).value();
  check_all(out, all_in("model.safetensors"));

  // DCP -> native: a checkpoint cairn verifies and loads on another topology.
  cairn_test::temp_dir nd;
  cairn::file_storage nat(nd.path);
  cv::convert_options native;
  native.format = cv::output_format::native;
  native.slab_bytes = 100;  // several chunks per tensor
  cv::convert(*dcp, nat, native).value();
  CHECK(cairn::verify_checkpoint(nat).value().empty());
  auto nm = cairn::read_metadata(nat).value();
  CHECK(nm.tensors.at("model.row").chunks.size() > 3);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::vector<std::byte> got(static_cast<std::size_t>(16 * 2 * 4));
    cairn::state_dict sd;
    cairn::sharded_tensor<> t;
    t.key = "model.row";
    t.type = dtype::f32;
    t.global_shape = {16, 6};
    t.local_shape = {16, 2};
    t.global_offset = {0, 2 * comm.rank()};
    t.data = got;
    sd.add("w", t);
    cairn::load(sd, nat, comm);
    std::vector<std::byte> want(got.size());
    cairn_test::fill_block("model.row", dtype::f32, {16, 6}, box{{0, 2 * comm.rank()}, {16, 2}},
                           want.data());
    CHECK(got == want);
  });
  // Converting again is refused: the target holds a checkpoint.
  auto again = cv::convert(*dcp, nat, native);
  REQUIRE(!again);
  CHECK(again.err().code == cairn::errc::already_exists);
  // Byte-identical output for the same source.
  cairn_test::temp_dir nd2;
  cairn::file_storage nat2(nd2.path);
  cv::convert(*dcp, nat2, native).value();
  auto names = nat.list("").value();
  for (const auto& f : names) {
    std::vector<std::byte> a(nat.size(f).value()), b(nat2.size(f).value());
    nat.read(f, 0, a).value();
    nat2.read(f, 0, b).value();
    CHECK(a == b);
  }
}

TEST_CASE("convert carries content_metadata into every output format") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt");
  save_multirank(ck);
  const std::map<std::string, std::string> want = {{"model", "convert-test"}, {"tp", "4"}};
  CHECK(cairn::read_content_metadata(ck).value() == want);
  for (auto format :
       {cv::output_format::native, cv::output_format::torch_dist, cv::output_format::one_file}) {
    CAPTURE(cv::format_name(format));
    cairn::file_storage out(d.path / std::string(cv::format_name(format)));
    auto src = cv::open_source(ck).value();
    cv::convert_options opt;
    opt.format = format;
    cv::convert(*src, out, opt).value();
    auto got = cairn::read_content_metadata(out).value();
    for (const auto& [k, v] : want) CHECK(got[k] == v);
    // And on again from the converted checkpoint: torch_dist's common.pt holds it too.
    if (format == cv::output_format::torch_dist) {
      cairn::file_storage again(d.path / "again");
      auto dist = cv::open_source(out).value();
      cv::convert_options native;
      native.format = cv::output_format::native;
      cv::convert(*dist, again, native).value();
      CHECK(cairn::read_content_metadata(again).value() == want);
    }
  }
}

TEST_CASE("open_source on a directory without a checkpoint fails clearly") {
  cairn_test::temp_dir d;
  cairn::file_storage st(d.path);
  auto r = cv::open_source(st);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::not_found);  // an empty directory
  CHECK(r.err().message.find("does not exist or is empty") != std::string::npos);
  // Files, but no committed metadata: a save that never committed.
  const std::string partial = "partial";
  st.put("data.0.0123456789ab.cairn", std::as_bytes(std::span(partial))).value();
  auto p = cv::open_source(st);
  REQUIRE(!p);
  CHECK(p.err().code == cairn::errc::incomplete_checkpoint);
  CHECK(p.err().message.find("torch_dist: .metadata") != std::string::npos);  // every format
}

namespace {
/// What the test writer "test_convert_echo" was last told.
std::map<std::string, std::string, std::less<>> echo_options;
cairn::result<void> echo_write(cairn::stream::source& src,
                               cairn::storage_ref,
                               const cairn::stream::write_job& job,
                               cairn::stream::stream_stats& stats,
                               cairn::detail::progress_meter*) {
  echo_options = job.options;
  stats.tensors = src.tensors().size();
  return cairn::ok();
}
}  // namespace

TEST_CASE("convert writes with any registered writer, telling it only the settings it declares") {
  CHECK(cairn::stream::register_stream_writer({.name = "test_convert_echo",
                                               .format = "echo",
                                               .settings = {"level"},
                                               .write = &echo_write})
            .value());
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_multirank(ck);
  auto src = cv::open_source(ck).value();
  cv::convert_options opt;
  opt.writer = "test_convert_echo";
  opt.writer_options = {{"level", "3"}};
  auto stats = cv::convert(*src, out, opt).value();
  CHECK(stats.tensors == kSpecs.size());
  CHECK(echo_options.at("level") == "3");
  CHECK(echo_options.size() == 1);  // chunk_size and flavor are other writers' settings
  CHECK(stats.skipped == std::vector<std::string>{"step"});  // it holds no common values

  opt.writer_options = {{"chunk_size", "1"}};
  auto undeclared = cv::convert(*src, out, opt);
  REQUIRE(!undeclared);
  CHECK(undeclared.err().code == cairn::errc::invalid_argument);
  CHECK(undeclared.err().message.find("no setting 'chunk_size' (it has level)") !=
        std::string::npos);
  opt.writer_options.clear();
  auto not_whole = cv::unshard(*src, out, opt);
  REQUIRE(!not_whole);
  CHECK(not_whole.err().message.find("one_file, per_tensor") != std::string::npos);
  opt.writer = "hdf5";
  CHECK(cv::convert(*src, out, opt).err().code == cairn::errc::not_found);
  // The typed options reach the built-in writers that declare them.
  cv::convert_options chunks;
  chunks.writer = "chunks";
  chunks.writer_options = {{"chunk_size", "not a size"}};
  auto bad = cv::convert(*src, out, chunks);
  REQUIRE(!bad);
  CHECK(bad.err().message.find("chunk_size") != std::string::npos);
  CHECK(out.list("").value().empty());
}
