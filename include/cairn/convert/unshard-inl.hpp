// cairn/convert/unshard-inl.hpp: the bodies of cairn/convert/unshard.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <string>

#include "cairn/convert/unshard.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/registry.hpp"

namespace cairn::convert::detail {

/// `first`, then `then` on the keys `first` keeps.
inline key_selector chain(key_selector first, key_selector then) {
  return [first = std::move(first),
          then = std::move(then)](std::string_view key) -> std::optional<std::string> {
    std::optional<std::string> mid = first(key);
    return mid ? then(*mid) : std::nullopt;
  };
}

}  // namespace cairn::convert::detail

namespace cairn::convert {

CAIRN_INLINE result<output_format> parse_output_format(std::string_view s) {
  // The names and aliases are the stream writers' (format/stream/writers.hpp).
  result<const stream::stream_writer*> w = stream::find_stream_writer(s);
  if (!w) return make_error(errc::invalid_argument, std::move(w).err().message);
  for (output_format x : {output_format::one_file, output_format::per_tensor, output_format::chunks,
                          output_format::torch_dist, output_format::native})
    if (format_name(x) == (*w)->name) return x;
  return make_error(errc::invalid_argument,
                    "'" + std::string(s) + "' is the stream writer " + (*w)->name +
                        ", not one of convert's built-in outputs: name it in "
                        "convert_options::writer");
}

CAIRN_INLINE std::string writer_name(const convert_options& opt) {
  return opt.writer.empty() ? std::string(format_name(opt.format)) : opt.writer;
}

CAIRN_INLINE result<convert_stats> convert(source& src,
                                           storage_ref dst,
                                           const convert_options& opt) {
  if (opt.fp32_masters || opt.select) {  // convert a view of `src` through the selection
    key_selector select = opt.select;
    if (opt.fp32_masters) {
      CAIRN_TRY_ASSIGN(key_selector masters, fp32_masters(src));
      select = opt.select ? detail::chain(std::move(masters), opt.select) : std::move(masters);
    }
    CAIRN_TRY_ASSIGN(std::unique_ptr<source> view, select_keys(src, std::move(select)));
    convert_options rest = opt;
    rest.fp32_masters = false;
    rest.select = nullptr;
    return convert(*view, dst, rest);
  }
  if (opt.to_dtype && !convertible_float(*opt.to_dtype))
    return make_error(errc::invalid_argument,
                      "convert: --dtype must be F16, BF16, F32 or F64, not " +
                          std::string(dtype_name(*opt.to_dtype)));
  if (opt.slab_bytes < 8) return make_error(errc::invalid_argument, "convert: slab below 8 bytes");
  CAIRN_TRY_ASSIGN(const stream::stream_writer* w, stream::find_stream_writer(writer_name(opt)));
  stream::write_job job{settings_of(opt), opt.metadata, {}, {}};
  for (const auto& name : w->settings) {  // the typed options, for the writers that read them
    if (name == "chunk_size") job.options[name] = std::to_string(opt.chunk_size);
    if (name == "flavor") job.options[name] = std::string(dcp::flavor_name(opt.dcp_flavor));
  }
  for (const auto& [name, value] : opt.writer_options) {
    if (std::find(w->settings.begin(), w->settings.end(), name) == w->settings.end()) {
      std::string known;
      for (const auto& k : w->settings) known += (known.empty() ? "" : ", ") + k;
      return make_error(errc::invalid_argument,
                        "convert: the " + w->name + " writer has no setting '" + name + "' (" +
                            (known.empty() ? "it has none" : "it has " + known) + ")");
    }
    job.options[name] = value;
  }
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
  // The sharded objects go along (read once) where the output holds them; other items
  // (pickled Python values) have no place.
  if (w->holds_objects) {
    CAIRN_TRY_ASSIGN(job.objects, src.objects());
  }
  CAIRN_TRY(w->write(src, dst, job, stats, &progress));
  for (auto& k : src.other_items())
    if (!job.objects.count(k)) stats.skipped.push_back(k);
  if (!w->holds_commons) {
    CAIRN_TRY_ASSIGN(auto commons, src.commons());
    for (const auto& [k, c] : commons) stats.skipped.push_back(k);
  }
  return stats;
}

CAIRN_INLINE result<convert_stats> unshard(source& src,
                                           storage_ref dst,
                                           const convert_options& opt) {
  CAIRN_TRY_ASSIGN(const stream::stream_writer* w, stream::find_stream_writer(writer_name(opt)));
  if (!w->whole_tensors) {
    std::string whole;
    for (const auto& name : stream::stream_writer_names())
      if (stream::find_stream_writer(name).value()->whole_tensors)
        whole += (whole.empty() ? "" : ", ") + name;
    return make_error(errc::invalid_argument,
                      "unshard writes whole tensors: the output format must be one that keeps "
                      "them whole (" +
                          whole + "), not " + w->name);
  }
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
