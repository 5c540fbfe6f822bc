// cairn/format/registry-inl.hpp: the bodies of cairn/format/registry.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "cairn/format/registry.hpp"

namespace cairn::detail {

/// torch_dist (PyTorch DCP): its `.metadata`, written last, commits it.
CAIRN_INLINE result<bool> holds_dcp(storage_ref st) {
  return st.exists(format_files::dcp_metadata);
}

/// safetensors: an index, `model.safetensors`, or else `*.safetensors` files at the top (DCP's
/// sharded safetensors, which have no index).
CAIRN_INLINE result<bool> holds_safetensors(storage_ref st) {
  CAIRN_TRY_ASSIGN(bool has_index, st.exists(format_files::safetensors_index));
  if (has_index) return true;
  CAIRN_TRY_ASSIGN(bool has_one, st.exists(format_files::safetensors_one));
  if (has_one) return true;
  CAIRN_TRY_ASSIGN(std::vector<std::string> names, st.list(""));
  for (const auto& n : names)
    if (format_files::is_top_level_safetensors(n)) return true;
  return false;
}

/// torch_save: `torch.save` files at the top (`format_files::is_torch_save_file`). Asked last:
/// Megatron's torch_dist has a `common.pt` beside its `.metadata`.
CAIRN_INLINE result<bool> holds_torch_save(storage_ref st) {
  CAIRN_TRY_ASSIGN(std::vector<std::string> names, st.list(""));
  return std::any_of(names.begin(), names.end(),
                     [](const std::string& n) { return format_files::is_torch_save_file(n); });
}

CAIRN_INLINE std::map<std::string, format_driver, std::less<>>& format_drivers() {
  // The foreign formats cairn knows: detected always, read once format/foreign.hpp registers
  // their readers.
  static std::map<std::string, format_driver, std::less<>> drivers{
      {"torch_dist",
       format_driver{"torch_dist", 10, {std::string(format_files::dcp_metadata)}, &holds_dcp}},
      {"safetensors", format_driver{"safetensors",
                                    20,
                                    {std::string(format_files::safetensors_index),
                                     std::string(format_files::safetensors_one)},
                                    &holds_safetensors}},
      // No commit marker (torch.save writes none); a file cut short fails to open, its ZIP
      // end records missing.
      {"torch_save", format_driver{"torch_save", 30, {}, &holds_torch_save}},
  };
  return drivers;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE bool register_format(format_driver driver) {
  auto& drivers = detail::format_drivers();
  if (auto it = drivers.find(driver.id); it != drivers.end() && !driver.read)
    driver.read = it->second.read;
  std::string id = driver.id;
  drivers.insert_or_assign(std::move(id), std::move(driver));
  return true;
}

CAIRN_INLINE bool register_format_reader(std::string id,
                                         format_reader reader,
                                         content_metadata_reader content) {
  auto& drivers = detail::format_drivers();
  auto it = drivers.find(id);
  if (it == drivers.end()) it = drivers.emplace(id, format_driver{id}).first;
  it->second.read = reader;
  if (content) it->second.read_content = content;
  return true;
}

CAIRN_INLINE std::vector<format_driver> registered_formats() {
  std::vector<format_driver> out;
  for (const auto& [id, d] : detail::format_drivers()) out.push_back(d);
  std::stable_sort(out.begin(), out.end(), [](const format_driver& a, const format_driver& b) {
    return a.detect_order < b.detect_order;
  });
  return out;
}

CAIRN_INLINE bool is_commit_marker(std::string_view name) {
  if (name == metadata_name) return true;
  for (const auto& [id, d] : detail::format_drivers())
    for (const auto& m : d.commit_markers)
      if (name == m) return true;
  return false;
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<sniffed_format> sniff_format(storage_ref st, bool whole_native) {
  CAIRN_TRY_ASSIGN(bool has_json, st.exists(metadata_name));
  if (has_json) {
    std::string head;
    if (whole_native) {
      CAIRN_TRY_ASSIGN(head, read_metadata_json(st));
    } else {
      CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(metadata_name));
      head.resize(static_cast<std::size_t>(std::min<std::uint64_t>(n, 4096)));
      CAIRN_TRY(st.read(metadata_name, 0, std::as_writable_bytes(std::span(head))));
    }
    if (std::string_view(head).substr(0, 4096).find("\"format\":\"cairn\"") != std::string::npos)
      return sniffed_format{"cairn", whole_native ? std::optional(std::move(head)) : std::nullopt};
  }
  for (const format_driver& d : registered_formats()) {
    if (!d.detect) continue;
    CAIRN_TRY_ASSIGN(bool found, d.detect(st));
    if (found) return sniffed_format{d.id, std::nullopt};
  }
  return sniffed_format{};
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE error detail::no_format_error(storage_ref st) {
  auto has_json = st.exists(metadata_name);
  if (!has_json) return std::move(has_json).err();
  if (*has_json) {  // a metadata.json that is not cairn's (say, Megatron's without .metadata)
    auto m = read_metadata(st);
    if (!m) return std::move(m).err();
  }
  return no_checkpoint_error(st, &is_commit_marker);
}

CAIRN_INLINE result<std::string> detect_format(storage_ref st) {
  CAIRN_TRY_ASSIGN(detail::sniffed_format found, detail::sniff_format(st, false));
  return std::move(found.format);
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<format_reader> reader_of(storage_ref st, const std::string& format) {
  auto it = format_drivers().find(format);
  if (it == format_drivers().end() || !it->second.read)
    return make_error(errc::unsupported_version,
                      "this is a " + format +
                          " checkpoint; include <cairn/format/foreign.hpp> (or "
                          "<cairn/strategies.hpp>) in the program to read it")
        .with_file(st.describe(""));
  return it->second.read;
}

/// The manifest of the checkpoint on `st`, whose format `sniff_format` found: the native
/// `metadata.json` it read, or what the format's reader gives.
inline result<checkpoint_metadata> manifest_of(storage_ref st, const sniffed_format& found) {
  if (found.native_json) return metadata_from_json(*found.native_json, st.describe(metadata_name));
  if (found.format.empty()) return no_format_error(st);
  CAIRN_TRY_ASSIGN(format_reader reader, reader_of(st, found.format));
  return reader(st);
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<checkpoint_metadata> read_any_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_any_manifest(st));
  // Only a native manifest names index files; every other reader fills the chunks itself.
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY(read_all_index_sections(st, m));
    return std::move(m);
  });
}

CAIRN_INLINE result<checkpoint_metadata> read_any_manifest(storage_ref st) {
  return detail::catch_all("reading the metadata", [&]() -> result<checkpoint_metadata> {
    CAIRN_TRY_ASSIGN(detail::sniffed_format found, detail::sniff_format(st, true));
    return detail::manifest_of(st, found);
  });
}

CAIRN_INLINE result<std::map<std::string, std::string>> read_content_metadata(storage_ref st) {
  using content = std::map<std::string, std::string>;
  return detail::catch_all("reading the content metadata", [&]() -> result<content> {
    CAIRN_TRY_ASSIGN(detail::sniffed_format found, detail::sniff_format(st, true));
    if (!found.native_json && !found.format.empty())
      if (auto it = detail::format_drivers().find(found.format);
          it != detail::format_drivers().end() && it->second.read_content)
        return it->second.read_content(st);
    CAIRN_TRY_ASSIGN(checkpoint_metadata m, detail::manifest_of(st, found));
    return std::move(m.content_metadata);
  });
}

CAIRN_INLINE result<verify_report> verify_any(storage_ref st,
                                              int threads,
                                              const progress_callback& progress) {
  return detail::catch_all("verifying the checkpoint", [&]() -> result<verify_report> {
    verify_report out;
    CAIRN_TRY_ASSIGN(out.format, detect_format(st));
    if (out.format.empty() || out.format == "cairn") {
      CAIRN_TRY_ASSIGN(out.problems, detail::verify_checkpoint_impl(st, threads, progress));
      out.format = "cairn";
      out.checksummed = true;
      return out;
    }
    CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_any_metadata(st));
    out.problems = detail::tiling_problems(st, m, "metadata");
    std::vector<std::optional<std::uint64_t>> sizes(m.files.size());
    for (std::size_t f = 0; f < m.files.size(); ++f) {
      auto sz = st.size(m.files[f].name);
      if (sz) {
        sizes[f] = *sz;
      } else {
        out.problems.push_back({"file " + m.files[f].name, std::move(sz).err()});
      }
    }
    std::uint64_t total = 0;
    for (const auto& [k, t] : m.tensors)
      for (const auto& c : t.chunks) total += c.where.nbytes;
    detail::progress_meter meter(&progress, "verify", total);
    std::vector<std::byte> buf;
    for (const auto& [k, t] : m.tensors) {
      for (std::size_t i = 0; i < t.chunks.size(); ++i) {
        const extent& e = t.chunks[i].where;
        const std::string label = "tensor '" + k + "' chunk " + std::to_string(i);
        if (e.file >= m.files.size() || !sizes[e.file]) continue;  // reported above
        const std::string& file = m.files[e.file].name;
        if (e.byte_offset > *sizes[e.file] || e.nbytes > *sizes[e.file] - e.byte_offset) {
          error err =
              make_error(errc::corrupt, "chunk of " + std::to_string(e.nbytes) +
                                            " bytes at offset " + std::to_string(e.byte_offset) +
                                            " runs past the end of its file (" +
                                            std::to_string(*sizes[e.file]) + " bytes)");
          err.key = k;
          err.file = st.describe(file);
          err.offset = e.byte_offset;
          out.problems.push_back({label, std::move(err)});
          continue;
        }
        for (std::uint64_t at = 0; at < e.nbytes; at += max_io_bytes) {
          buf.resize(static_cast<std::size_t>(std::min(max_io_bytes, e.nbytes - at)));
          if (auto r = st.read(file, e.byte_offset + at, buf); !r) {
            out.problems.push_back({label, std::move(r).err().with_key(k)});
            break;
          }
          meter.add(buf.size());
        }
      }
    }
    meter.finish();  // chunks skipped or failed part way count as checked
    return out;
  });
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE result<metadata_json> read_any_metadata_json_impl(storage_ref st) {
  CAIRN_TRY_ASSIGN(sniffed_format found, sniff_format(st, true));
  if (found.native_json) return metadata_json{std::move(*found.native_json), false};
  if (found.format.empty()) {  // a metadata.json that is not cairn's: its error
    CAIRN_TRY_ASSIGN(bool has_json, st.exists(metadata_name));
    if (!has_json) return no_format_error(st);
    CAIRN_TRY_ASSIGN(std::string json, read_metadata_json(st));
    return metadata_json{std::move(json), false};
  }
  CAIRN_TRY_ASSIGN(format_reader reader, detail::reader_of(st, found.format));
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, reader(st));
  return metadata_json{to_json(m), true};
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<metadata_json> read_any_metadata_json(storage_ref st) {
  return detail::catch_all("reading the metadata",
                           [&] { return detail::read_any_metadata_json_impl(st); });
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE std::optional<common_value> coerce_common(const common_value& from, dtype to) {
  if (from.kind == common_kind::string || from.type == to) return from;
  common_value out{from.kind, to, {}};
  std::size_t n = from.data.size() / dtype_size(from.type);
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* p = from.data.data() + i * dtype_size(from.type);
    double d = 0;
    std::int64_t k = 0;
    bool is_int = from.type != dtype::f64;
    if (from.type == dtype::f64)
      std::memcpy(&d, p, 8);
    else if (from.type == dtype::i64)
      std::memcpy(&k, p, 8);
    else
      k = static_cast<std::int64_t>(std::to_integer<std::uint8_t>(*p));
    auto emit = [&](auto x) {
      auto b = std::as_bytes(std::span(&x, 1));
      out.data.insert(out.data.end(), b.begin(), b.end());
    };
    // An integer target: `k` in T's range.
    auto as_int = [&]<class T>(T) {
      if (!is_int || k < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
          (k > 0 && static_cast<std::uint64_t>(k) > std::numeric_limits<T>::max()))
        return false;
      emit(static_cast<T>(k));
      return true;
    };
    auto as_any_int = [&]<class... T>(T... tags) {
      return ((to == dtype_of<T> && as_int(tags)) || ...);
    };
    bool good = false;
    if (to == dtype::bool_) {
      good = is_int && (k == 0 || k == 1) && (emit(static_cast<std::uint8_t>(k)), true);
    } else if (to == dtype::f32) {
      double x = is_int ? static_cast<double>(k) : d;
      float f = static_cast<float>(x);
      good = (static_cast<double>(f) == x || std::isnan(x)) && (emit(f), true);
    } else if (to == dtype::f64) {
      good = (emit(is_int ? static_cast<double>(k) : d), true);
    } else {
      good = as_any_int(std::int8_t{}, std::uint8_t{}, std::int16_t{}, std::uint16_t{},
                        std::int32_t{}, std::uint32_t{}, std::int64_t{}, std::uint64_t{});
    }
    if (!good) return std::nullopt;
  }
  return out;
}

}  // namespace cairn::detail
