// cairn/convert/unshard.hpp: `unshard` (any readable checkpoint -> consolidated safetensors,
// DeepSpeed zero_to_fp32's job), `convert` (-> safetensors or PyTorch DCP / Megatron torch_dist),
// both streaming with memory bounded by one slab, and `consolidate` (whole tensors in memory,
// DeepSpeed's get_fp32_state_dict_from_zero_checkpoint). Notes in docs/unshard.md.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/native/writer.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/files.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/load.hpp"
#include "cairn/plan/save_plan.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::convert {

/// Output formats of `convert` (the safetensors ones are also `unshard`'s).
enum class output_format {
  one_file,    ///< one `model.safetensors`
  per_tensor,  ///< one `<key>.safetensors` per tensor ('/' in keys becomes '-'), plus the index
  chunks,      ///< `model-NNNNN-of-MMMMM.safetensors` of at most `chunk_size` bytes, plus the index
  torch_dist,  ///< PyTorch DCP (`.metadata`, `__0_0.distcp`) + Megatron `metadata.json`,
               ///< `common.pt`
  native,      ///< cairn's own format, one data file written streaming
};

/// The output format's command-line name ("one_file", "torch_dist", ...).
constexpr std::string_view format_name(output_format s) noexcept {
  switch (s) {
    case output_format::one_file:
      return "one_file";
    case output_format::per_tensor:
      return "per_tensor";
    case output_format::chunks:
      return "chunks";
    case output_format::torch_dist:
      return "torch_dist";
    case output_format::native:
      return "native";
  }
  return "?";
}

/// Parses an output format name; errc::invalid_argument for unknown names.
inline result<output_format> parse_output_format(std::string_view s) {
  for (output_format x : {output_format::one_file, output_format::per_tensor, output_format::chunks,
                          output_format::torch_dist, output_format::native})
    if (format_name(x) == s) return x;
  return make_error(errc::invalid_argument,
                    "unknown output format '" + std::string(s) +
                        "' (one_file, per_tensor, chunks, torch_dist, native)");
}

/// Options of `convert` and `unshard`.
struct convert_options {
  output_format format = output_format::one_file;
  /// `chunks`: the most tensor bytes per file (a tensor larger than this gets a file alone).
  std::uint64_t chunk_size = 5'000'000'000;
  /// Convert floating-point tensors (F16, BF16, F32, F64) to this floating dtype; other tensors
  /// (integers, bool, FP8) are written as they are. Exact when widening.
  std::optional<dtype> to_dtype;
  /// The most bytes read and converted at once: peak memory is about twice this plus the
  /// reader's own I/O buffers. Also the size of each DCP item in `torch_dist` output.
  std::uint64_t slab_bytes = std::uint64_t{64} << 20;
  /// The safetensors `__metadata__` of every file.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  /// Threads that write each slab (in parallel pieces of at least 8 MiB).
  int io_threads = 2;
  /// `torch_dist`: which torch module paths `.metadata` names.
  dcp::flavor dcp_flavor = dcp::flavor::torch2;
  /// Told how many source tensor bytes are done ("convert"; after each slab).
  progress_callback progress;
};

/// What a conversion wrote.
struct convert_stats {
  std::vector<std::string> files;    ///< objects written, in order
  std::size_t tensors = 0;           ///< tensors written
  std::uint64_t bytes_read = 0;      ///< tensor bytes read from the source
  std::uint64_t bytes_written = 0;   ///< tensor bytes written (after dtype conversion)
  std::vector<std::string> skipped;  ///< non-tensor items not carried over
};

/// True for the floating dtypes `to_dtype` converts between.
constexpr bool convertible_float(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}

/// The dtype tensor `t` is written as under `to`.
constexpr dtype output_dtype(dtype t, std::optional<dtype> to) noexcept {
  return to && convertible_float(t) ? *to : t;
}

/// Converts `in` (elements of `from`) into `out` (the same count of `to`). Widening
/// (F16/BF16 -> F32/F64, F32 -> F64) is exact; narrowing rounds to nearest even.
inline void convert_elements(dtype from,
                             dtype to,
                             std::span<const std::byte> in,
                             std::span<std::byte> out) {
  const std::size_t n = in.size() / dtype_size(from);
  const std::size_t ei = dtype_size(from), eo = dtype_size(to);
  // 16- and 32-bit values go through float (bit-exact, NaN payloads kept); only F64 on either
  // side goes through double.
  auto load_f = [&](const std::byte* p) -> float {
    std::uint16_t h;
    float f;
    double d;
    switch (from) {
      case dtype::f16:
        std::memcpy(&h, p, 2);
        return f16::to_float(h);
      case dtype::bf16:
        std::memcpy(&h, p, 2);
        return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
      case dtype::f32:
        std::memcpy(&f, p, 4);
        return f;
      default:
        std::memcpy(&d, p, 8);
        return static_cast<float>(d);
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* p = in.data() + i * ei;
    std::byte* q = out.data() + i * eo;
    if (to == dtype::f64) {
      double v;
      if (from == dtype::f64)
        std::memcpy(&v, p, 8);
      else
        v = static_cast<double>(load_f(p));
      std::memcpy(q, &v, 8);
      continue;
    }
    float v = load_f(p);
    if (to == dtype::f32) {
      std::memcpy(q, &v, 4);
    } else {
      std::uint16_t h = to == dtype::f16 ? f16::from_float(v) : bf16(v).bits;
      std::memcpy(q, &h, 2);
    }
  }
}

/// Cuts a tensor into boxes of at most `max_bytes` (elements of `elem_size` bytes), each
/// contiguous in the tensor's row-major order and listed in that order: whole rows of the
/// outermost axis whose inner block fits, single-index prefixes above it. A rank-0 or empty
/// tensor is one box.
inline std::vector<box> slabs(const shape& dims, std::size_t elem_size, std::uint64_t max_bytes) {
  const std::size_t n = dims.size();
  box whole{shape(n, 0), dims};
  if (n == 0 || numel(dims) == 0) return {whole};
  std::size_t k = 0;
  std::uint64_t inner = elem_size;
  for (std::size_t a = 1; a < n; ++a) inner *= static_cast<std::uint64_t>(dims[a]);
  while (k + 1 < n && inner > max_bytes) inner /= static_cast<std::uint64_t>(dims[++k]);
  std::int64_t step = static_cast<std::int64_t>(std::max<std::uint64_t>(1, max_bytes / inner));
  std::vector<box> out;
  shape idx(k, 0);
  for (;;) {
    for (std::int64_t j = 0; j < dims[k]; j += step) {
      box b = whole;
      for (std::size_t a = 0; a < k; ++a) {
        b.offset[a] = idx[a];
        b.size[a] = 1;
      }
      b.offset[k] = j;
      b.size[k] = std::min(step, dims[k] - j);
      out.push_back(std::move(b));
    }
    std::size_t a = k;
    while (a > 0) {
      --a;
      if (++idx[a] < dims[a]) break;
      idx[a] = 0;
      if (a == 0) return out;
    }
    if (k == 0) return out;
  }
}

/// Slab memory reused across pumps (a conversion of many files allocates it once; it is never
/// zeroed: every byte is read into before use). Fresh memory costs a page fault per 4 KiB.
struct slab_buffers {
  /// At least `n` bytes of the buffer `which` (0: read, 1: converted).
  std::span<std::byte> get(int which, std::size_t n) {
    if (size_[which] < n) {
      buf_[which].reset(new std::byte[n]);
      size_[which] = n;
    }
    return {buf_[which].get(), n};
  }

 private:
  std::unique_ptr<std::byte[]> buf_[2];
  std::size_t size_[2] = {0, 0};
};

/// The safetensors split of a safetensors output format (`one_file` for any other).
constexpr safetensors::file_split split_of(output_format f) noexcept {
  return f == output_format::per_tensor ? safetensors::file_split::per_tensor
         : f == output_format::chunks   ? safetensors::file_split::chunks
                                        : safetensors::file_split::one_file;
}

/// The safetensors files of `ts` in `opt.format` (one_file, per_tensor or chunks of at most
/// `opt.chunk_size` bytes), with the dtypes `opt.to_dtype` converts to. Deterministic.
inline result<std::vector<safetensors::planned_file>> plan_safetensors(
    const std::vector<tensor_entry>& ts, const convert_options& opt) {
  std::vector<safetensors::tensor_decl> decls;
  for (const auto& t : ts)
    decls.push_back({t.key, output_dtype(t.type, opt.to_dtype), t.global_shape});
  return safetensors::plan_files(decls, split_of(opt.format), opt.chunk_size);
}

namespace detail {

/// One slab to move: a box of a tensor and where its output bytes go inside the tensor.
struct slab_job {
  const tensor_entry* t;
  box region;
  std::uint64_t out_offset;  ///< byte offset of the slab in the output tensor
  dtype out_type;
};

/// Reads `jobs` in batches of at most `slab_bytes` into one reused buffer, converts dtypes,
/// and hands each slab's output bytes to `sink(job, bytes)`.
template <class Sink>
result<void> pump(source& src,
                  const std::vector<slab_job>& jobs,
                  const convert_options& opt,
                  convert_stats& stats,
                  cairn::detail::progress_meter* progress,
                  Sink&& sink,
                  slab_buffers* buffers = nullptr) {
  std::optional<slab_buffers> own;
  if (!buffers) buffers = &own.emplace();
  std::size_t i = 0;
  while (i < jobs.size()) {
    std::size_t j = i;
    std::uint64_t bytes = 0;
    std::vector<box_read> reqs;
    std::vector<std::uint64_t> at;
    while (j < jobs.size()) {
      std::uint64_t b =
          static_cast<std::uint64_t>(jobs[j].region.volume()) * dtype_size(jobs[j].t->type);
      if (j > i && bytes + b > opt.slab_bytes) break;
      at.push_back(bytes);
      bytes += b;
      ++j;
    }
    std::span<std::byte> buf = buffers->get(0, static_cast<std::size_t>(bytes));
    for (std::size_t q = i; q < j; ++q) {
      std::uint64_t b =
          static_cast<std::uint64_t>(jobs[q].region.volume()) * dtype_size(jobs[q].t->type);
      reqs.push_back(
          {jobs[q].t->key, jobs[q].region, buf.subspan(static_cast<std::size_t>(at[q - i]), b)});
    }
    CAIRN_TRY(src.read(reqs));
    for (std::size_t q = i; q < j; ++q) {
      const slab_job& job = jobs[q];
      std::span<const std::byte> in = reqs[q - i].out;
      if (job.out_type != job.t->type) {
        std::size_t m = in.size() / dtype_size(job.t->type) * dtype_size(job.out_type);
        std::span<std::byte> conv = buffers->get(1, m);
        convert_elements(job.t->type, job.out_type, in, conv);
        in = conv;
      }
      CAIRN_TRY(sink(job, in));
      stats.bytes_read += reqs[q - i].out.size();
      stats.bytes_written += in.size();
    }
    if (progress) progress->add(bytes);
    i = j;
  }
  return ok();
}

inline std::vector<slab_job> plan_jobs(const std::vector<const tensor_entry*>& ts,
                                       const convert_options& opt) {
  std::vector<slab_job> jobs;
  for (const tensor_entry* t : ts) {
    dtype out = output_dtype(t->type, opt.to_dtype);
    std::size_t es = std::max(dtype_size(t->type), dtype_size(out));
    for (box& b : slabs(t->global_shape, es, opt.slab_bytes)) {
      std::int64_t flat = 0;
      for (std::size_t a = 0; a < b.offset.size(); ++a)
        flat = flat * t->global_shape[a] + b.offset[a];
      if (numel(t->global_shape) == 0) flat = 0;
      jobs.push_back({t, std::move(b), static_cast<std::uint64_t>(flat) * dtype_size(out), out});
    }
  }
  return jobs;
}

}  // namespace detail

/// Writes the planned safetensors file `f`, reading its tensors from `src` one slab at a time in
/// file order (the disk sees one sequential stream; memory bounded by `opt.slab_bytes`).
/// `progress`: told the source bytes done (none when null); `buffers`: slab memory to reuse.
inline result<void> write_safetensors_file(source& src,
                                           storage_ref dst,
                                           const safetensors::planned_file& f,
                                           const convert_options& opt,
                                           convert_stats& stats,
                                           cairn::detail::progress_meter* progress = nullptr,
                                           slab_buffers* buffers = nullptr) {
  CAIRN_TRY_ASSIGN(safetensors::writer w,
                   safetensors::writer::open(dst, f.name, f.tensors, opt.metadata));
  std::vector<const tensor_entry*> ordered;
  for (const auto& info : w.planned().tensors) {
    const tensor_entry* t = src.find(info.name);
    if (!t) return make_error(errc::not_found, "no such tensor in the source").with_key(info.name);
    ordered.push_back(t);
  }
  CAIRN_TRY(detail::pump(
      src, detail::plan_jobs(ordered, opt), opt, stats, progress,
      [&](const detail::slab_job& job, std::span<const std::byte> bytes) -> result<void> {
        const std::size_t piece = std::size_t{8} << 20;
        std::size_t n = (bytes.size() + piece - 1) / piece;
        return cairn::detail::run_parallel(n, opt.io_threads, [&](std::size_t k) -> result<void> {
          std::size_t at = k * piece;
          return w.write_at(job.t->key, job.out_offset + at,
                            bytes.subspan(at, std::min(piece, bytes.size() - at)));
        });
      },
      buffers));
  CAIRN_TRY(w.finish());
  stats.files.push_back(f.name);
  stats.tensors += f.tensors.size();
  return ok();
}

namespace detail {

inline result<void> write_safetensors(source& src,
                                      storage_ref dst,
                                      const convert_options& opt,
                                      convert_stats& stats,
                                      cairn::detail::progress_meter* progress) {
  CAIRN_TRY_ASSIGN(auto files, plan_safetensors(src.tensors(), opt));
  slab_buffers buffers;
  for (const auto& f : files)
    CAIRN_TRY(write_safetensors_file(src, dst, f, opt, stats, progress, &buffers));
  if (opt.format != output_format::one_file) {
    CAIRN_TRY_ASSIGN(safetensors::index ix, safetensors::index_of(files));
    CAIRN_TRY(safetensors::write_index(dst, safetensors::index_name, ix));
    stats.files.emplace_back(safetensors::index_name);
  }
  return ok();
}

inline result<void> write_torch_dist(source& src,
                                     storage_ref dst,
                                     const convert_options& opt,
                                     convert_stats& stats,
                                     cairn::detail::progress_meter* progress) {
  const std::string data_name = "__0_0.distcp";
  dcp::metadata m;
  std::vector<const tensor_entry*> ts;
  for (const auto& t : src.tensors()) {
    CAIRN_TRY(dcp::check_flavor_holds(opt.dcp_flavor, output_dtype(t.type, opt.to_dtype), t.key));
    ts.push_back(&t);
  }
  CAIRN_TRY_ASSIGN(auto out, dst.open_writer(data_name));
  std::uint64_t off = 0;
  CAIRN_TRY(pump(src, plan_jobs(ts, opt), opt, stats, progress,
                 [&](const slab_job& job, std::span<const std::byte> bytes) -> result<void> {
                   const std::string& key = job.t->key;
                   CAIRN_TRY_ASSIGN(std::uint64_t len,
                                    torch_zip::write_tensor_item(
                                        *out, off, {key, job.out_type, job.region.size, bytes},
                                        dst.describe(data_name)));
                   dcp::add_tensor_chunk(m, key, job.out_type, job.t->global_shape, job.region,
                                         {data_name, off, len});
                   off += len;
                   return ok();
                 }));
  {
    auto f = out->finish();
    if (!f) return std::move(f).err().with_file(dst.describe(data_name));
  }
  stats.files.push_back(data_name);
  stats.tensors = ts.size();
  CAIRN_TRY_ASSIGN(auto commons, src.commons());
  CAIRN_TRY_ASSIGN(auto written, dcp::write_commit_files(dst, m, opt.dcp_flavor, commons));
  stats.files.insert(stats.files.end(), written.begin(), written.end());
  return ok();
}

/// Writes `src` as a native cairn checkpoint: every slab becomes a chunk of one data file,
/// checksummed per block as it streams past; common values go to the common-state file;
/// `metadata.json` is written last. The save id is derived from the tensor list, so the same
/// source gives byte-identical output.
inline result<void> write_native(source& src,
                                 storage_ref dst,
                                 const convert_options& opt,
                                 convert_stats& stats,
                                 cairn::detail::progress_meter* progress) {
  CAIRN_TRY_ASSIGN(std::string existing, detect_format(dst));
  if (!existing.empty())
    return make_error(errc::already_exists,
                      "convert: a " + existing + " checkpoint is already there")
        .with_file(dst.describe(""));
  const std::uint64_t B = default_block_size;
  checkpoint_metadata m;
  m.world_size = 1;
  m.block_size = B;
  cairn::detail::binary_writer idw;
  for (const auto& t : src.tensors()) {
    idw.str(t.key);
    idw.u64(static_cast<std::uint64_t>(numel(t.global_shape)));
  }
  m.save_id = checksum_hex(checksum(idw.data())).substr(0, 12);
  const std::string data_name = data_file_name(0, m.save_id);
  std::vector<const tensor_entry*> ts;
  for (const auto& t : src.tensors()) {
    ts.push_back(&t);
    m.tensors[t.key] = tensor_record{output_dtype(t.type, opt.to_dtype), t.global_shape, {}};
  }
  CAIRN_TRY_ASSIGN(auto out, dst.open_writer(data_name));
  std::uint64_t off = 0;
  CAIRN_TRY(pump(src, plan_jobs(ts, opt), opt, stats, progress,
                 [&](const slab_job& job, std::span<const std::byte> bytes) -> result<void> {
                   auto w = out->write_at(off, bytes);
                   if (!w) return std::move(w).err().with_key(job.t->key);
                   m.tensors[job.t->key].chunks.push_back(chunk_record{
                       job.region, extent{0, off, bytes.size(), block_checksums(bytes, B)}, {}});
                   off += bytes.size();
                   return ok();
                 }));
  if (auto f = out->finish(); !f) return std::move(f).err().with_file(dst.describe(data_name));
  m.files.push_back(file_record{data_name, 0, off});
  stats.files.push_back(data_name);
  stats.tensors = ts.size();
  CAIRN_TRY_ASSIGN(auto commons, src.commons());
  if (!commons.empty()) {
    CAIRN_TRY_ASSIGN(cairn::common_state cs,
                     cairn::write_common_state(dst, common_file_name(m.save_id), commons, B));
    stats.files.push_back(cs.name);
    cairn::add_common_state(m, std::move(cs));
  }
  m.version = required_version(m);  // 1: nothing tiled or compressed
  CAIRN_TRY(cairn::put_metadata(dst, m));
  stats.files.emplace_back(metadata_name);
  return ok();
}

}  // namespace detail

/// Rewrites the checkpoint `src` into `dst` (which should be empty) in `opt.format`, streaming:
/// tensors are read and written one slab (`opt.slab_bytes`) at a time, never whole. The same
/// source and options give byte-identical output. Non-tensor items that have no place in the
/// target are listed in `convert_stats::skipped`.
///
///     cairn::file_storage in{"ckpt/step_100"}, out{"hf/step_100"};
///     auto src = cairn::convert::open_source(in).value();
///     cairn::convert::convert(*src, out, {.format =
///     cairn::convert::output_format::chunks}).value();
inline result<convert_stats> convert(source& src, storage_ref dst, const convert_options& opt) {
  if (opt.to_dtype && !convertible_float(*opt.to_dtype))
    return make_error(errc::invalid_argument,
                      "convert: --dtype must be F16, BF16, F32 or F64, not " +
                          std::string(dtype_name(*opt.to_dtype)));
  if (opt.slab_bytes < 8) return make_error(errc::invalid_argument, "convert: slab below 8 bytes");
  convert_stats stats;
  std::uint64_t total = 0;
  for (const auto& t : src.tensors()) total += t.nbytes();
  cairn::detail::progress_meter progress(&opt.progress, "convert", total);
  if (opt.format == output_format::torch_dist) {
    CAIRN_TRY(detail::write_torch_dist(src, dst, opt, stats, &progress));
    stats.skipped = src.other_items();
  } else if (opt.format == output_format::native) {
    CAIRN_TRY(detail::write_native(src, dst, opt, stats, &progress));
    stats.skipped = src.other_items();
  } else {
    CAIRN_TRY(detail::write_safetensors(src, dst, opt, stats, &progress));
    stats.skipped = src.other_items();
    CAIRN_TRY_ASSIGN(auto commons, src.commons());
    for (const auto& [k, c] : commons) stats.skipped.push_back(k);
  }
  return stats;
}

/// Consolidates a sharded checkpoint (any readable format, distributed-optimizer slices
/// included) into safetensors — what DeepSpeed's `zero_to_fp32.py` does, streaming.
/// `opt.format` must be one_file, per_tensor or chunks.
inline result<convert_stats> unshard(source& src, storage_ref dst, const convert_options& opt) {
  if (opt.format != output_format::one_file && opt.format != output_format::per_tensor &&
      opt.format != output_format::chunks)
    return make_error(
        errc::invalid_argument,
        "unshard writes safetensors: the output format must be one_file, per_tensor or "
        "chunks, not " +
            std::string(format_name(opt.format)));
  return convert(src, dst, opt);
}

/// Every tensor of `src` whole in memory, floating tensors converted to `to` when given — the
/// equivalent of DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint`. Needs memory for the
/// whole model; use `unshard` to stream to files instead.
inline result<std::map<std::string, tensor_data>> consolidate(source& src,
                                                              std::optional<dtype> to = {}) {
  std::map<std::string, tensor_data> out;
  std::vector<std::byte> tmp;
  for (const auto& t : src.tensors()) {
    tensor_data d;
    d.type = output_dtype(t.type, to);
    d.global_shape = t.global_shape;
    // The source checked the shape against its files; memory may still run out (resource).
    CAIRN_TRY_ASSIGN(
        d.data,
        format_detail::buffer(
            static_cast<std::uint64_t>(numel(t.global_shape)) * dtype_size(d.type), {}, t.key));
    box whole{shape(t.global_shape.size(), 0), t.global_shape};
    if (d.type == t.type) {
      CAIRN_TRY(src.read_box(t.key, whole, d.data));
    } else {
      CAIRN_TRY_ASSIGN(tmp, format_detail::buffer(t.nbytes(), {}, t.key));
      CAIRN_TRY(src.read_box(t.key, whole, tmp));
      convert_elements(t.type, d.type, tmp, d.data);
    }
    out.emplace(t.key, std::move(d));
  }
  return out;
}

}  // namespace cairn::convert
