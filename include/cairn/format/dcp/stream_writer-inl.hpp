// cairn/format/dcp/stream_writer-inl.hpp: the bodies of cairn/format/dcp/stream_writer.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <vector>

#include "cairn/format/dcp/stream_writer.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/torch/zip.hpp"

namespace cairn::dcp {

CAIRN_INLINE result<void> write_streamed(stream::source& src,
                                         storage_ref dst,
                                         flavor fl,
                                         const stream::stream_settings& settings,
                                         const std::map<std::string, stream::object_entry>& objects,
                                         stream::stream_stats& stats,
                                         cairn::detail::progress_meter* progress) {
  const std::string data_name = "__0_0.distcp";
  metadata m;
  std::vector<const stream::tensor_entry*> ts;
  for (const auto& t : src.tensors()) {
    CAIRN_TRY(check_flavor_holds(fl, stream::output_dtype(t.type, settings.to_dtype), t.key));
    ts.push_back(&t);
  }
  CAIRN_TRY_ASSIGN(auto out, dst.open_writer(data_name));
  std::uint64_t off = 0;
  CAIRN_TRY(stream::detail::pump(
      src, stream::detail::plan_jobs(ts, settings), settings, stats, progress,
      [&](const stream::detail::slab_job& job, std::span<const std::byte> bytes) -> result<void> {
        const std::string& key = job.t->key;
        CAIRN_TRY_ASSIGN(
            std::uint64_t len,
            torch_zip::write_tensor_item(*out, off, {key, job.out_type, job.region.size, bytes},
                                         dst.describe(data_name)));
        add_tensor_chunk(m, key, job.out_type, job.t->global_shape, job.region,
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
    add_bytes_item(m, u, {data_name, off, len});
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
  CAIRN_TRY_ASSIGN(auto written, write_commit_files(dst, m, fl, commons, src.content_metadata()));
  stats.files.insert(stats.files.end(), written.begin(), written.end());
  return ok();
}

CAIRN_INLINE result<void> detail::stream_write(stream::source& src,
                                               storage_ref dst,
                                               const stream::write_job& job,
                                               stream::stream_stats& stats,
                                               cairn::detail::progress_meter* progress) {
  flavor fl = flavor::torch2;
  if (auto it = job.options.find("flavor"); it != job.options.end()) {
    if (it->second == flavor_name(flavor::torch1_13))
      fl = flavor::torch1_13;
    else if (it->second != flavor_name(flavor::torch2))
      return make_error(
          errc::invalid_argument,
          "torch_dist: setting flavor must be torch2 or torch1_13, not '" + it->second + "'");
  }
  return write_streamed(src, dst, fl, job.settings, job.objects, stats, progress);
}

}  // namespace cairn::dcp
