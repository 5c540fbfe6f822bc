// The C++ side of the Python interop tests (tests/system/interop/interop.py): writes safetensors,
// .pt and DCP files with cairn's format modules, and checks files torch wrote. Every tensor holds a
// formula both sides compute independently, so comparisons are element-exact.
//
//   cairn_interop write-safetensors DIR | write-pt DIR | write-dcp DIR
//   cairn_interop check-pt FILE | check-dcp DIR
//   cairn_interop write-multirank DIR | unshard SRC DST | convert-dcp SRC DST
//   cairn_interop save-strategy NAME DIR | load-dcp DIR | remove-prefix DIR PREFIX
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/strategies.hpp"

namespace {
using cairn::dtype;

// The dtypes under test and the names the Python side uses for them: the ten every torch has,
// and with --all-dtypes (torch 2.x) also the unsigned (torch >= 2.3) and float8 (>= 2.1) ones.
std::vector<std::pair<dtype, std::string>> kTypes = {
    {dtype::f32, "f32"}, {dtype::f16, "f16"},   {dtype::bf16, "bf16"}, {dtype::f64, "f64"},
    {dtype::i64, "i64"}, {dtype::i32, "i32"},   {dtype::i16, "i16"},   {dtype::i8, "i8"},
    {dtype::u8, "u8"},   {dtype::bool_, "bool"}};
const std::vector<std::pair<dtype, std::string>> kTorch2Types = {{dtype::u16, "u16"},
                                                                 {dtype::u32, "u32"},
                                                                 {dtype::u64, "u64"},
                                                                 {dtype::f8_e4m3, "f8_e4m3"},
                                                                 {dtype::f8_e5m2, "f8_e5m2"}};

// Element i of the test pattern, as little-endian bytes of `t`. Mirrors interop.py's pattern().
void element(dtype t, std::int64_t i, std::byte* out) {
  double f = static_cast<double>((i * 37) % 101 - 50) / 8.0;
  auto put = [&](auto v) { std::memcpy(out, &v, sizeof v); };
  switch (t) {
    case dtype::f32:
      return put(static_cast<float>(f));
    case dtype::f64:
      return put(f);
    case dtype::f16:
      return put(cairn::f16(static_cast<float>(f)).bits);
    case dtype::bf16:
      return put(cairn::bf16(static_cast<float>(f)).bits);
    case dtype::i64:
      return put(static_cast<std::int64_t>((i * 1000003 - 5000) * 1048576));
    case dtype::i32:
      return put(static_cast<std::int32_t>(i * 100003 - 5000));
    case dtype::i16:
      return put(static_cast<std::int16_t>((i * 37) % 65536 - 32768));
    case dtype::i8:
      return put(static_cast<std::int8_t>((i * 7) % 256 - 128));
    case dtype::u8:
      return put(static_cast<std::uint8_t>((i * 7) % 256));
    case dtype::bool_:
      return put(static_cast<std::uint8_t>(i % 3 == 0));
    case dtype::u16:
      return put(static_cast<std::uint16_t>((i * 37) % 65536));
    case dtype::u32:
      return put(static_cast<std::uint32_t>(i * 100003 + 5000));
    case dtype::u64:
      return put(static_cast<std::uint64_t>((i * 1000003 + 5000) * 1048576));
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:  // every bit pattern, compared as bytes
      return put(static_cast<std::uint8_t>((i * 37 + 11) % 256));
  }
}

std::vector<std::byte> pattern(dtype t, std::int64_t n, std::int64_t first = 0) {
  std::vector<std::byte> b(static_cast<std::size_t>(n) * cairn::dtype_size(t));
  for (std::int64_t i = 0; i < n; ++i) element(t, first + i, b.data() + i * cairn::dtype_size(t));
  return b;
}

// The pattern over box `b` (2-d) of a tensor with `C` columns, row-major.
std::vector<std::byte> box_pattern(dtype t, const cairn::box& b, std::int64_t C) {
  const std::size_t es = cairn::dtype_size(t);
  std::vector<std::byte> out(static_cast<std::size_t>(b.volume()) * es);
  std::int64_t k = 0;
  for (std::int64_t y = 0; y < b.size[0]; ++y)
    for (std::int64_t x = 0; x < b.size[1]; ++x, ++k)
      element(t, (b.offset[0] + y) * C + b.offset[1] + x, out.data() + k * es);
  return out;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "cairn_interop: %s\n", what.c_str());
  return 1;
}

int write_safetensors(const std::string& dir) {
  cairn::file_storage st(dir);
  std::vector<std::vector<std::byte>> keep;
  std::vector<cairn::safetensors::tensor_view> ts;
  for (auto& [t, name] : kTypes) {
    keep.push_back(pattern(t, 15));
    ts.push_back({"t_" + name, t, {3, 5}, keep.back()});
  }
  keep.push_back(pattern(dtype::f32, 1));
  ts.push_back({"scalar", dtype::f32, {}, keep.back()});
  ts.push_back({"empty", dtype::i32, {0, 3}, {}});
  cairn::safetensors::write_file(st, "model.safetensors", ts, {{"format", "pt"}}).value();
  // The same tensors in two files with an index, streamed in two pieces per tensor.
  cairn::safetensors::index ix;
  for (int part = 0; part < 2; ++part) {
    std::string file = "model-0000" + std::to_string(part + 1) + "-of-00002.safetensors";
    std::vector<cairn::safetensors::tensor_decl> decls;
    for (std::size_t i = part; i < kTypes.size(); i += 2)
      decls.push_back({"t_" + kTypes[i].second, kTypes[i].first, {3, 5}});
    auto w = cairn::safetensors::writer::open(st, file, decls, {{"format", "pt"}}).value();
    for (std::size_t i = part; i < kTypes.size(); i += 2) {
      std::span<const std::byte> all = keep[i];
      std::string name = "t_" + kTypes[i].second;
      w.write_at(name, 8, all.subspan(8)).value();
      w.write_at(name, 0, all.subspan(0, 8)).value();
      ix.weight_map[name] = file;
      ix.total_size += all.size();
    }
    w.finish().value();
  }
  cairn::safetensors::write_index(st, cairn::safetensors::index_name, ix).value();
  return 0;
}

int write_pt(const std::string& dir) {
  cairn::file_storage st(dir);
  std::vector<std::vector<std::byte>> keep;
  std::vector<cairn::torch_zip::tensor_view> ts;
  for (auto& [t, name] : kTypes) {
    keep.push_back(pattern(t, 15));
    ts.push_back({"t_" + name, t, {3, 5}, keep.back()});
  }
  keep.push_back(pattern(dtype::i64, 1));
  ts.push_back({"scalar", dtype::i64, {}, keep.back()});
  ts.push_back({"empty", dtype::f32, {0, 3}, {}});
  cairn::torch_zip::write_pt(st, "cairn.pt", ts).value();
  return 0;
}

// Checks tensor `key` of a torch.save archive against the pattern.
bool check_tensor(const cairn::torch_zip::archive& a,
                  const cairn::torch_zip::tensor_ref& t,
                  dtype want,
                  const std::vector<std::byte>& expect,
                  const std::string& what) {
  if (t.type != want) {
    std::fprintf(stderr, "%s: dtype %s, want %s\n", what.c_str(),
                 std::string(cairn::dtype_name(t.type)).c_str(),
                 std::string(cairn::dtype_name(want)).c_str());
    return false;
  }
  auto got = cairn::torch_zip::read_tensor(a, t).value();
  if (got != expect) {
    std::fprintf(stderr, "%s: values differ\n", what.c_str());
    return false;
  }
  return true;
}

int check_pt(const std::string& path) {
  std::filesystem::path p(path);
  cairn::file_storage st(p.parent_path());
  auto a = cairn::torch_zip::open_archive(st, p.filename().string()).value();
  auto found = cairn::torch_zip::find_tensors(a.root);
  bool ok = true;
  int checked = 0;
  for (const auto& [name, t] : found) {
    for (auto& [dt, dn] : kTypes) {
      if (name == "t_" + dn) {
        ok &= t.dims == cairn::shape{3, 5};
        ok &= check_tensor(a, t, dt, pattern(dt, 15), name);
        ++checked;
      }
    }
    if (name == "transposed") {  // pattern f32 (3, 5) .t(): element [i][j] = pattern[j * 5 + i]
      auto base = pattern(dtype::f32, 15);
      std::vector<std::byte> want;
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 3; ++j)
          want.insert(want.end(), base.begin() + (j * 5 + i) * 4,
                      base.begin() + (j * 5 + i) * 4 + 4);
      ok &= t.dims == cairn::shape{5, 3} && check_tensor(a, t, dtype::f32, want, name);
      ++checked;
    }
    if (name == "slice") {  // pattern i64 (15)[4:9], sharing storage with "full"
      ok &=
          t.storage_offset == 4 && check_tensor(a, t, dtype::i64, pattern(dtype::i64, 5, 4), name);
      ++checked;
    }
  }
  if (checked != static_cast<int>(kTypes.size()) + 2)
    return fail("check-pt: found " + std::to_string(checked) + " of the expected tensors");
  if (!ok) return fail("check-pt: mismatches (above)");
  std::printf("check-pt: %d tensors element-exact\n", checked);
  return 0;
}

// A single-rank DCP checkpoint in flavor `f` (module paths of torch 1.13 or 2.x): every
// t_<dtype> is (4, 6), saved as two row chunks, all items in __0_0.distcp; plus the bytes item
// "step" = 7.
int write_dcp(const std::string& dir, cairn::dcp::flavor f) {
  cairn::file_storage st(dir);
  cairn::dcp::metadata m;
  auto out = st.open_writer("__0_0.distcp").value();
  std::uint64_t off = 0;
  for (auto& [t, name] : kTypes) {
    std::string fqn = "t_" + name;
    cairn::dcp::tensor_meta tm{t, {4, 6}, {}};
    for (std::int64_t row : {0, 2}) {
      auto bytes = pattern(t, 12, row * 6);
      auto len = cairn::torch_zip::write_tensor_item(*out, off, {fqn, t, {2, 6}, bytes}).value();
      tm.chunks.push_back({{row, 0}, {2, 6}});
      m.storage_data.push_back({{fqn, cairn::shape{row, 0}, static_cast<std::int64_t>(row / 2)},
                                {"__0_0.distcp", off, len}});
      off += len;
    }
    m.state_dict_metadata[fqn] = tm;
  }
  auto len =
      cairn::torch_zip::write_archive(*out, off, "archive", cairn::pickle::value::integer(7), {})
          .value();
  m.state_dict_metadata["step"] = cairn::dcp::bytes_meta{};
  m.storage_data.push_back({{"step", std::nullopt, std::nullopt}, {"__0_0.distcp", off, len}});
  out->finish().value();
  cairn::dcp::write(st, m, f).value();
  return 0;
}

// Reads a DCP checkpoint torch 1.13 saved from {t_<dtype>: pattern (4, 6)} and checks every
// chunk element-exactly against the pattern.
int check_dcp(const std::string& dir) {
  cairn::file_storage st(dir);
  auto m = cairn::dcp::read(st).value();
  int checked = 0;
  bool ok = true;
  for (auto& [t, name] : kTypes) {
    std::string fqn = "t_" + name;
    auto it = m.state_dict_metadata.find(fqn);
    if (it == m.state_dict_metadata.end()) return fail("check-dcp: missing " + fqn);
    const auto& tm = std::get<cairn::dcp::tensor_meta>(it->second);
    ok &= tm.type == t && tm.size == cairn::shape{4, 6};
    for (const auto& c : tm.chunks) {
      const auto* where = m.find(fqn, c.offsets);
      if (!where) return fail("check-dcp: no storage for a chunk of " + fqn);
      auto a =
          cairn::torch_zip::open_archive(st, where->relative_path, where->offset, where->length)
              .value();
      auto ref = cairn::torch_zip::as_tensor(a.root);
      if (!ref) return fail("check-dcp: item of " + fqn + " is not a tensor");
      std::vector<std::byte> want;
      for (std::int64_t r = 0; r < c.sizes[0]; ++r) {
        auto row = pattern(t, c.sizes[1], (c.offsets[0] + r) * 6 + c.offsets[1]);
        want.insert(want.end(), row.begin(), row.end());
      }
      ok &= ref->dims == c.sizes && check_tensor(a, *ref, t, want, fqn);
      ++checked;
    }
  }
  if (!ok) return fail("check-dcp: mismatches (above)");
  std::printf("check-dcp: %d chunks element-exact (metadata class %s.%s)\n", checked,
              m.class_module.c_str(), m.class_name.c_str());
  return 0;
}
// A cairn checkpoint saved on 4 thread ranks: t_<dtype> is (8, 6) holding pattern(48), split by
// rows (dtypes 0, 3, 6, 9), by uneven columns (1, 4, 7) or as flattened distributed-optimizer
// slices (2, 5, 8); plus the common value "step" = 12.
// With a strategy, the checkpoint is saved in that layout (safetensors: without "step").
int write_multirank(const std::string& dir, const cairn::save_strategy* strategy = nullptr) {
  cairn::file_storage st(dir);
  const std::int64_t R = 8, C = 6;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<std::byte>> bufs(kTypes.size());
    cairn::state_dict sd;
    for (std::size_t i = 0; i < kTypes.size(); ++i) {
      auto [t, name] = kTypes[i];
      const std::size_t es = cairn::dtype_size(t);
      cairn::box b{{0, 0}, {R, C}};
      if (i % 3 == 0) {
        b = {{2 * r, 0}, {2, C}};
      } else if (i % 3 == 1) {
        const std::int64_t cuts[] = {0, 2, 3, 5, 6};
        b = {{0, cuts[r]}, {R, cuts[r + 1] - cuts[r]}};
      }
      std::vector<std::byte> blk = box_pattern(t, b, C);
      cairn::sharded_tensor<> st_;
      st_.key = "t_" + name;
      st_.type = t;
      st_.local_shape = b.size;
      st_.global_shape = {R, C};
      st_.global_offset = b.offset;
      if (i % 3 == 2) {
        std::int64_t lo = R * C * r / 4, hi = R * C * (r + 1) / 4;
        st_.flattened_range = cairn::flat_range{lo, hi};
        bufs[i].assign(blk.begin() + lo * static_cast<std::int64_t>(es),
                       blk.begin() + hi * static_cast<std::int64_t>(es));
      } else {
        bufs[i] = std::move(blk);
      }
      st_.data = bufs[i];
      sd.add(st_.key, st_);
    }
    if (!dynamic_cast<const cairn::safetensors_strategy*>(strategy))
      sd.add("step", std::int64_t{12});
    cairn::save_options so;
    so.strategy = strategy;
    if (dynamic_cast<const cairn::torch_dist_strategy*>(strategy))
      so.content_metadata = {{"source", "cairn interop"}, {"tp", "4"}};  // Megatron's place
    cairn::save(sd, st, comm, so);
  });
  return 0;
}

// Saves the 4-rank checkpoint with strategy NAME (torch_dist, one_file, per_tensor, chunks).
int save_strategy(const std::string& name, const std::string& dir) {
  namespace cv = cairn::convert;
  if (name == "torch_dist") {
    cairn::torch_dist_strategy s;
    return write_multirank(dir, &s);
  }
  auto format = cv::parse_output_format(name).value();
  cairn::safetensors_strategy s(cv::split_of(format), 200);  // chunks: at most 200 bytes per file
  return write_multirank(dir, &s);
}

/// The tensor `key` of dtype `type` and global shape `global` whose box `b` this rank loads into
/// `bytes` (b.volume() elements).
cairn::sharded_tensor<> box_view(const std::string& key,
                                 cairn::dtype type,
                                 const cairn::shape& global,
                                 const cairn::box& b,
                                 std::span<std::byte> bytes) {
  cairn::sharded_tensor<> x;
  x.key = key;
  x.type = type;
  x.local_shape = b.size;
  x.global_shape = global;
  x.global_offset = b.offset;
  x.data = bytes;
  return x;
}

// Loads every t_<dtype> of a checkpoint torch wrote (DCP, or safetensors through its Hugging Face
// storage writer; global shape ROWS x COLS, holding the pattern) on `ranks` thread ranks, each
// asking for an uneven piece along `axis` (0: rows, 1: columns), and checks every piece
// element-exactly. Torch wrote it from any number of processes and layouts. `only`, when not
// empty, names the dtypes it holds (comma-separated), else it holds them all.
int load_dcp_layout(const std::string& dir,
                    std::int64_t R,
                    std::int64_t C,
                    int ranks,
                    int axis,
                    const std::string& only = {}) {
  if (!only.empty()) {
    std::erase_if(kTypes, [&](const auto& t) {
      return ("," + only + ",").find("," + t.second + ",") == std::string::npos;
    });
    if (kTypes.empty()) return fail("load-dcp-layout: no known dtype in " + only);
  }
  cairn::file_storage st(dir);
  std::atomic<int> bad{0};
  cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    const std::int64_t n = axis == 0 ? R : C;
    const std::int64_t lo = n * r / ranks, hi = n * (r + 1) / ranks;
    cairn::box b =
        axis == 0 ? cairn::box{{lo, 0}, {hi - lo, C}} : cairn::box{{0, lo}, {R, hi - lo}};
    std::vector<std::vector<std::byte>> bufs(kTypes.size());
    cairn::state_dict sd;
    for (std::size_t i = 0; i < kTypes.size(); ++i) {
      auto [t, name] = kTypes[i];
      bufs[i].assign(static_cast<std::size_t>(b.volume()) * cairn::dtype_size(t), std::byte{0x77});
      sd.add("t_" + name, box_view("t_" + name, t, {R, C}, b, bufs[i]));
    }
    cairn::load(sd, st, comm);
    for (std::size_t i = 0; i < kTypes.size(); ++i) {
      if (bufs[i] != box_pattern(kTypes[i].first, b, C)) {
        std::fprintf(stderr, "load-dcp-layout: t_%s differs on rank %d of %d (axis %d)\n",
                     kTypes[i].second.c_str(), r, ranks, axis);
        ++bad;
      }
    }
  });
  if (bad) return fail("load-dcp-layout: mismatches (above)");
  std::printf(
      "load-dcp-layout: cairn::load on %d ranks (split along axis %d) read %zu dtypes "
      "element-exact\n",
      ranks, axis, kTypes.size());
  return 0;
}

/// Element `i` of `bytes` (of dtype `t`) as a double, for the dtypes DeepSpeed checkpoints hold.
double element_as_double(cairn::dtype t, const std::byte* bytes, std::int64_t i) {
  const std::byte* p = bytes + static_cast<std::size_t>(i) * cairn::dtype_size(t);
  auto read = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case cairn::dtype::f32:
      return read(float{});
    case cairn::dtype::f64:
      return read(double{});
    case cairn::dtype::i64:
      return static_cast<double>(read(std::int64_t{}));
    case cairn::dtype::f16:
      return cairn::f16::to_float(read(std::uint16_t{}));
    case cairn::dtype::bf16:
      return std::bit_cast<float>(static_cast<std::uint32_t>(read(std::uint16_t{})) << 16);
    default:
      throw std::runtime_error("load-deepspeed: no comparison for this dtype");
  }
}

// Loads the DeepSpeed ZeRO checkpoint in DIR (format "deepspeed") on RANKS thread ranks, each
// tensor split by rows, and compares it with DIR_EXPECTED's torch.save of what DeepSpeed's
// zero_to_fp32 gives: the same keys; tensors of the same dtype bit for bit, the others (buffers,
// which zero_to_fp32 turns into float32) value for value.
int load_deepspeed(const std::string& dir, const std::string& expected_dir, int ranks) {
  cairn::file_storage st(dir), ex(expected_dir);
  auto meta = cairn::read_any_metadata(st).value();
  if (meta.format != "deepspeed") return fail("load-deepspeed: detected as " + meta.format);
  auto want = cairn::load_tensors(ex).value();
  std::vector<std::string> keys;
  for (const auto& [k, t] : meta.tensors) keys.push_back(k);
  for (const auto& [k, t] : want)
    if (!meta.tensors.count(k)) return fail("load-deepspeed: missing tensor " + k);
  if (keys.size() != want.size())
    return fail("load-deepspeed: " + std::to_string(keys.size()) + " tensors, zero_to_fp32 has " +
                std::to_string(want.size()));
  std::atomic<int> bad{0};
  cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<std::byte>> bufs(keys.size());
    std::vector<cairn::box> boxes(keys.size());
    cairn::state_dict sd;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const cairn::tensor_record& rec = meta.tensors.at(keys[i]);
      cairn::box b{cairn::shape(rec.global_shape.size(), 0), rec.global_shape};
      if (!b.size.empty()) {  // rows [lo, hi) of axis 0
        const std::int64_t n = b.size[0], lo = n * r / ranks, hi = n * (r + 1) / ranks;
        b.offset[0] = lo;
        b.size[0] = hi - lo;
      } else if (r != 0) {
        continue;  // a scalar: rank 0 loads it
      }
      boxes[i] = b;
      bufs[i].assign(static_cast<std::size_t>(b.volume()) * cairn::dtype_size(rec.type),
                     std::byte{0x77});
      sd.add(keys[i], box_view(keys[i], rec.type, rec.global_shape, b, bufs[i]));
    }
    cairn::load(sd, st, comm);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (bufs[i].empty() && boxes[i].volume() != 0) continue;
      const cairn::tensor_record& rec = meta.tensors.at(keys[i]);
      const cairn::tensor_data& w = want.at(keys[i]);
      // The box's elements are a run of the row-major tensor (it is whole rows).
      std::int64_t first = 0, row = 1;
      for (std::size_t d = 1; d < rec.global_shape.size(); ++d) row *= rec.global_shape[d];
      if (!rec.global_shape.empty()) first = boxes[i].offset[0] * row;
      for (std::int64_t e = 0; e < boxes[i].volume(); ++e) {
        const bool same = rec.type == w.type
                              ? std::memcmp(bufs[i].data() + e * cairn::dtype_size(rec.type),
                                            w.data.data() + (first + e) * cairn::dtype_size(w.type),
                                            cairn::dtype_size(rec.type)) == 0
                              : element_as_double(rec.type, bufs[i].data(), e) ==
                                    element_as_double(w.type, w.data.data(), first + e);
        if (!same) {
          std::fprintf(stderr, "load-deepspeed: %s differs at element %lld on rank %d of %d\n",
                       keys[i].c_str(), static_cast<long long>(first + e), r, ranks);
          ++bad;
          break;
        }
      }
    }
  });
  if (bad) return fail("load-deepspeed: mismatches (above)");
  std::printf(
      "load-deepspeed: %s (stage %lld, %d data-parallel ranks) loaded on %d ranks: %zu "
      "tensors as zero_to_fp32 gives them\n",
      dir.c_str(), static_cast<long long>(meta.inline_commons.at("zero_stage").as<std::int64_t>()),
      meta.world_size, ranks, keys.size());
  return 0;
}

// Unshards SRC into DST/model.safetensors (one_file) and DST/chunks (chunks of 200 bytes).
int unshard(const std::string& src_dir, const std::string& dst) {
  namespace cv = cairn::convert;
  cairn::file_storage in(src_dir), one(dst), chunks(dst + "/chunks");
  auto src = cv::open_source(in).value();
  cv::convert_options opt;
  opt.slab_bytes = 40;
  cv::unshard(*src, one, opt).value();
  opt.format = cv::output_format::chunks;
  opt.chunk_size = 200;
  cv::unshard(*src, chunks, opt).value();
  return 0;
}

// Converts SRC into a torch_dist checkpoint in DST (small slabs: several DCP items per tensor).
int convert_dcp(const std::string& src_dir, const std::string& dst) {
  namespace cv = cairn::convert;
  cairn::file_storage in(src_dir), out(dst);
  auto src = cv::open_source(in).value();
  cv::convert_options opt;
  opt.format = cv::output_format::torch_dist;
  opt.slab_bytes = 40;
  cv::convert(*src, out, opt).value();
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--all-dtypes") {
    kTypes.insert(kTypes.end(), kTorch2Types.begin(), kTorch2Types.end());
    --argc;
    ++argv;
  }
  if ((argc == 7 || argc == 8) && std::string(argv[1]) == "load-dcp-layout") {
    try {
      return load_dcp_layout(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), std::stoi(argv[5]),
                             std::stoi(argv[6]), argc == 8 ? argv[7] : "");
    } catch (const cairn::exception& e) {
      return fail(e.what());
    }
  }
  if (argc == 5 && std::string(argv[1]) == "load-deepspeed") {
    try {
      return load_deepspeed(argv[2], argv[3], std::stoi(argv[4]));
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  if (argc == 4) {
    std::string cmd = argv[1];
    try {
      if (cmd == "unshard") return unshard(argv[2], argv[3]);
      if (cmd == "convert-dcp") return convert_dcp(argv[2], argv[3]);
      if (cmd == "save-strategy") return save_strategy(argv[2], argv[3]);
      if (cmd == "remove-prefix") {
        cairn::file_storage st(argv[2]);
        for (const auto& key : cairn::remove_sharded_tensors(st, argv[3]).value())
          std::printf("removed %s\n", key.c_str());
        return 0;
      }
    } catch (const cairn::exception& e) {
      return fail(e.what());
    }
    return fail("unknown command " + cmd);
  }
  if (argc != 3)
    return fail(
        "usage: cairn_interop [--all-dtypes] write-safetensors|write-pt|write-dcp|write-dcp-torch2 "
        "DIR | check-pt FILE | check-dcp DIR");
  std::string cmd = argv[1], arg = argv[2];
  try {
    if (cmd == "write-safetensors") return write_safetensors(arg);
    if (cmd == "write-pt") return write_pt(arg);
    if (cmd == "write-dcp") return write_dcp(arg, cairn::dcp::flavor::torch1_13);
    if (cmd == "write-dcp-torch2") return write_dcp(arg, cairn::dcp::flavor::torch2);
    if (cmd == "check-pt") return check_pt(arg);
    if (cmd == "check-dcp") return check_dcp(arg);
    // A checkpoint torch saved from {t_<dtype>: pattern (4, 6)}, on 3 ranks by uneven rows.
    if (cmd == "load-dcp") return load_dcp_layout(arg, 4, 6, 3, 0);
    if (cmd == "write-multirank") return write_multirank(arg);
  } catch (const cairn::exception& e) {
    return fail(e.what());
  }
  return fail("unknown command " + cmd);
}
