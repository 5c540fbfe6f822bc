// cairn/convert/unshard-inl.hpp: the bodies of cairn/convert/unshard.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>

#include "cairn/convert/unshard.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/native/writer.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/plan/save_plan.hpp"

namespace cairn::convert {

CAIRN_INLINE result<output_format> parse_output_format(std::string_view s) {
  for (output_format x : {output_format::one_file, output_format::per_tensor, output_format::chunks,
                          output_format::torch_dist, output_format::native})
    if (format_name(x) == s) return x;
  if (s == "safetensors") return output_format::one_file;  // the format's own name
  if (s == "dcp" || s == "torch") return output_format::torch_dist;
  if (s == "cairn") return output_format::native;
  return make_error(errc::invalid_argument,
                    "unknown output format '" + std::string(s) +
                        "' (one_file or safetensors, per_tensor, chunks, torch_dist or dcp, "
                        "native or cairn)");
}

CAIRN_INLINE void convert_elements(dtype from,
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

CAIRN_INLINE std::vector<box> slabs(const shape& dims,
                                    std::size_t elem_size,
                                    std::uint64_t max_bytes) {
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

CAIRN_INLINE std::span<std::byte> slab_buffers::get(int which, std::size_t n) {
  if (size_[which] < n) {
    buf_[which].reset(new std::byte[n]);
    size_[which] = n;
  }
  return {buf_[which].get(), n};
}

CAIRN_INLINE result<std::vector<safetensors::planned_file>> plan_safetensors(
    const std::vector<tensor_entry>& ts, const convert_options& opt) {
  std::vector<safetensors::tensor_decl> decls;
  for (const auto& t : ts)
    decls.push_back({t.key, output_dtype(t.type, opt.to_dtype), t.global_shape});
  return safetensors::plan_files(decls, split_of(opt.format), opt.chunk_size);
}

}  // namespace cairn::convert

namespace cairn::convert::detail {

CAIRN_INLINE std::vector<slab_job> plan_jobs(const std::vector<const tensor_entry*>& ts,
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

}  // namespace cairn::convert::detail

namespace cairn::convert {

CAIRN_INLINE result<void> write_safetensors_file(source& src,
                                                 storage_ref dst,
                                                 const safetensors::planned_file& f,
                                                 const convert_options& opt,
                                                 convert_stats& stats,
                                                 cairn::detail::progress_meter* progress,
                                                 slab_buffers* buffers) {
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

}  // namespace cairn::convert

namespace cairn::convert::detail {

CAIRN_INLINE result<void> write_safetensors(source& src,
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

CAIRN_INLINE result<void> write_torch_dist(source& src,
                                           storage_ref dst,
                                           const convert_options& opt,
                                           const std::map<std::string, object_entry>& objects,
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
  // Sharded objects: a u8 tensor item each under its unique key, as the torch_dist strategy
  // writes them (and Megatron reads them).
  for (const auto& [u, o] : objects) {
    CAIRN_TRY_ASSIGN(
        auto len,
        torch_zip::write_tensor_item(
            *out, off, {u, dtype::u8, shape{static_cast<std::int64_t>(o.bytes.size())}, o.bytes},
            dst.describe(data_name)));
    dcp::add_bytes_item(m, u, {data_name, off, len});
    off += len;
  }
  {
    auto f = out->finish();
    if (!f) return std::move(f).err().with_file(dst.describe(data_name));
  }
  stats.files.push_back(data_name);
  stats.tensors = ts.size();
  stats.objects = objects.size();
  CAIRN_TRY_ASSIGN(auto commons, src.commons());
  CAIRN_TRY_ASSIGN(auto written, dcp::write_commit_files(dst, m, opt.dcp_flavor, commons));
  stats.files.insert(stats.files.end(), written.begin(), written.end());
  return ok();
}

CAIRN_INLINE result<void> write_native(source& src,
                                       storage_ref dst,
                                       const convert_options& opt,
                                       const std::map<std::string, object_entry>& objects,
                                       convert_stats& stats,
                                       cairn::detail::progress_meter* progress) {
  const std::uint64_t B = default_block_size;
  checkpoint_metadata m;
  m.world_size = 1;
  m.block_size = B;
  // The save id: a hash of the keys and sizes, so that converting the same input twice names
  // the data file the same.
  cairn::detail::message_writer idw;
  for (const auto& t : src.tensors())
    cairn::detail::write_message(
        idw, std::pair(t.key, static_cast<std::uint64_t>(numel(t.global_shape))));
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
  for (const auto& [u, o] : objects) {
    auto w = out->write_at(off, o.bytes);
    if (!w) return std::move(w).err().with_key(u);
    m.objects.emplace(u,
                      object_record{o.key, o.global_shape, o.global_offset,
                                    extent{0, off, o.bytes.size(), block_checksums(o.bytes, B)}});
    off += o.bytes.size();
  }
  stats.objects = objects.size();
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

}  // namespace cairn::convert::detail

namespace cairn::convert {

CAIRN_INLINE result<convert_stats> convert(source& src,
                                           storage_ref dst,
                                           const convert_options& opt) {
  if (opt.to_dtype && !convertible_float(*opt.to_dtype))
    return make_error(errc::invalid_argument,
                      "convert: --dtype must be F16, BF16, F32 or F64, not " +
                          std::string(dtype_name(*opt.to_dtype)));
  if (opt.slab_bytes < 8) return make_error(errc::invalid_argument, "convert: slab below 8 bytes");
  if (!opt.overwrite) {
    CAIRN_TRY_ASSIGN(std::string existing, detect_format(dst));
    if (!existing.empty())
      return make_error(errc::already_exists,
                        "convert: a " + existing +
                            " checkpoint is already there; set overwrite (cairn convert "
                            "--overwrite) to write over it")
          .with_file(dst.describe(""));
  }
  convert_stats stats;
  std::uint64_t total = 0;
  for (const auto& t : src.tensors()) total += t.nbytes();
  cairn::detail::progress_meter progress(&opt.progress, "convert", total);
  if (opt.format == output_format::torch_dist || opt.format == output_format::native) {
    // The sharded objects go along (read once); other items (pickled Python values) have no
    // place.
    CAIRN_TRY_ASSIGN(auto objects, src.objects());
    if (opt.format == output_format::torch_dist)
      CAIRN_TRY(detail::write_torch_dist(src, dst, opt, objects, stats, &progress));
    else
      CAIRN_TRY(detail::write_native(src, dst, opt, objects, stats, &progress));
    for (auto& k : src.other_items())
      if (!objects.count(k)) stats.skipped.push_back(k);
  } else {
    CAIRN_TRY(detail::write_safetensors(src, dst, opt, stats, &progress));
    stats.skipped = src.other_items();
    CAIRN_TRY_ASSIGN(auto commons, src.commons());
    for (const auto& [k, c] : commons) stats.skipped.push_back(k);
  }
  return stats;
}

CAIRN_INLINE result<convert_stats> unshard(source& src,
                                           storage_ref dst,
                                           const convert_options& opt) {
  if (opt.format != output_format::one_file && opt.format != output_format::per_tensor &&
      opt.format != output_format::chunks)
    return make_error(
        errc::invalid_argument,
        "unshard writes safetensors: the output format must be one_file, per_tensor or "
        "chunks, not " +
            std::string(format_name(opt.format)));
  return convert(src, dst, opt);
}

CAIRN_INLINE result<std::map<std::string, tensor_data>> consolidate(source& src,
                                                                    std::optional<dtype> to) {
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
