// cairn/format/safetensors/file-inl.hpp: the bodies of cairn/format/safetensors/file.hpp (included
// by it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <simdjson.h>

#include <algorithm>
#include <new>
#include <set>

#include "cairn/format/safetensors/file.hpp"

namespace cairn::safetensors {

CAIRN_INLINE const tensor_info* header::find(std::string_view name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace cairn::safetensors

namespace cairn::safetensors::detail {

CAIRN_INLINE std::uint64_t checked_nbytes(const shape& dims, dtype t, bool& ok) {
  auto n = format_detail::file_numel(dims, dtype_size(t));
  ok = n.has_value();
  return ok ? static_cast<std::uint64_t>(*n) * dtype_size(t) : 0;
}

}  // namespace cairn::safetensors::detail

namespace cairn::safetensors {

CAIRN_INLINE result<header> plan(std::vector<tensor_decl> tensors,
                                 std::map<std::string, std::string> metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const tensor_decl& a, const tensor_decl& b) {
    int ra = detail::dtype_rank(a.type), rb = detail::dtype_rank(b.type);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });
  header h;
  h.metadata = std::move(metadata);
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto& d = tensors[i];
    if (d.name == "__metadata__")
      return make_error(errc::invalid_argument,
                        "safetensors: tensor name '__metadata__' is reserved");
    if (i && tensors[i - 1].name == d.name)
      return make_error(errc::invalid_argument, "safetensors: duplicate tensor name")
          .with_key(d.name);
    bool ok;
    std::uint64_t n = detail::checked_nbytes(d.dims, d.type, ok);
    if (!ok)
      return make_error(errc::invalid_argument, "safetensors: invalid shape").with_key(d.name);
    h.tensors.push_back(tensor_info{std::move(d.name), d.type, std::move(d.dims), off, off + n, 0});
    off += n;
  }
  // Sorting by name after dtype can leave equal names apart: check all names.
  std::set<std::string_view> names;
  for (const auto& t : h.tensors)
    if (!names.insert(t.name).second)
      return make_error(errc::invalid_argument, "safetensors: duplicate tensor name")
          .with_key(t.name);
  return h;
}

CAIRN_INLINE std::string encode_header(header& h) {
  std::string json = "{";
  bool first = true;
  if (!h.metadata.empty()) {
    json += "\"__metadata__\":{";
    bool f = true;
    for (const auto& [k, v] : h.metadata) {
      if (!f) json += ',';
      f = false;
      format_detail::json_string(json, k);
      json += ':';
      format_detail::json_string(json, v);
    }
    json += '}';
    first = false;
  }
  for (const auto& t : h.tensors) {
    if (!first) json += ',';
    first = false;
    format_detail::json_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += dtype_name(t.type);
    json += "\",\"shape\":[";
    for (std::size_t a = 0; a < t.dims.size(); ++a) {
      if (a) json += ',';
      json += std::to_string(t.dims[a]);
    }
    json += "],\"data_offsets\":[" + std::to_string(t.begin) + ',' + std::to_string(t.end) + "]}";
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  format_detail::put_le(out, json.size(), 8);
  out += json;
  h.data_start = out.size();
  h.file_size = h.data_start + (h.tensors.empty() ? 0 : h.tensors.back().end);
  for (auto& t : h.tensors) t.data_start = h.data_start;
  return out;
}

CAIRN_INLINE result<writer> writer::open(storage_ref st,
                                         std::string_view name,
                                         std::vector<tensor_decl> tensors,
                                         std::map<std::string, std::string> metadata) {
  CAIRN_TRY_ASSIGN(header h, plan(std::move(tensors), std::move(metadata)));
  CAIRN_TRY_ASSIGN(auto out, st.open_writer(name));
  writer w(std::move(h), std::move(out), st.describe(name));
  w.header_bytes_ = encode_header(w.h_);  // also fixes every tensor's offset
  w.written_.assign(w.h_.tensors.size(), 0);
  return w;
}

CAIRN_INLINE result<void> writer::write(std::string_view name, std::span<const std::byte> data) {
  CAIRN_TRY_ASSIGN(std::size_t i, index(name));
  if (data.size() != h_.tensors[i].nbytes())
    return format_detail::fail(errc::invalid_argument,
                               "safetensors: tensor needs " +
                                   std::to_string(h_.tensors[i].nbytes()) + " bytes, got " +
                                   std::to_string(data.size()),
                               file_, name);
  return write_at(name, 0, data);
}

CAIRN_INLINE result<void> writer::write_at(std::string_view name,
                                           std::uint64_t offset,
                                           std::span<const std::byte> data) {
  CAIRN_TRY_ASSIGN(std::size_t i, index(name));
  const auto& t = h_.tensors[i];
  if (offset > t.nbytes() || data.size() > t.nbytes() - offset)
    return format_detail::fail(errc::invalid_argument,
                               "safetensors: write past the end of the tensor", file_, name,
                               t.file_offset() + offset);
  if (!data.empty()) {
    auto r = out_->write_at(t.file_offset() + offset, data);
    if (!r) return std::move(r).err().with_key(std::string(name)).with_file(file_);
  }
  std::lock_guard lock(*mu_);
  written_[i] += data.size();
  return ok();
}

CAIRN_INLINE result<void> writer::finish() {
  for (std::size_t i = 0; i < h_.tensors.size(); ++i)
    if (written_[i] != h_.tensors[i].nbytes())
      return format_detail::fail(errc::invalid_argument,
                                 "safetensors: tensor got " + std::to_string(written_[i]) + " of " +
                                     std::to_string(h_.tensors[i].nbytes()) + " bytes",
                                 file_, h_.tensors[i].name, h_.tensors[i].file_offset());
  if (auto w = out_->write_at(0, format_detail::as_bytes(header_bytes_)); !w)
    return std::move(w).err().with_file(file_);
  auto r = out_->finish();
  if (!r) return std::move(r).err().with_file(file_);
  return ok();
}

CAIRN_INLINE writer::writer(header h, std::unique_ptr<object_writer> out, std::string file)
    : h_(std::move(h)), out_(std::move(out)), file_(std::move(file)) {
  for (std::size_t i = 0; i < h_.tensors.size(); ++i) by_name_.emplace(h_.tensors[i].name, i);
}

CAIRN_INLINE result<std::size_t> writer::index(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return format_detail::fail(errc::not_found, "safetensors: tensor was not declared", file_,
                               name);
  return it->second;
}

CAIRN_INLINE result<void> write_file(storage_ref st,
                                     std::string_view name,
                                     const std::vector<tensor_view>& tensors,
                                     std::map<std::string, std::string> metadata) {
  std::vector<tensor_decl> decls;
  for (const auto& t : tensors) decls.push_back({t.name, t.type, t.dims});
  CAIRN_TRY_ASSIGN(writer w, writer::open(st, name, std::move(decls), std::move(metadata)));
  for (const auto& t : tensors) CAIRN_TRY(w.write(t.name, t.data));
  return w.finish();
}

}  // namespace cairn::safetensors

namespace cairn::safetensors::detail {

/// Reads `__metadata__` (`v`, entry `key`), which must be an object of strings, into
/// `h.metadata`.
CAIRN_INLINE result<void> parse_header_metadata(simdjson::dom::element v,
                                                const std::string& key,
                                                std::string_view file,
                                                header& h) {
  simdjson::dom::object m;
  if (v.get_object().get(m))
    return format_detail::corrupt("safetensors: __metadata__ is not an object", file, key, 8);
  for (auto [mk, mv] : m) {
    std::string_view s;
    if (mv.get_string().get(s))
      return format_detail::corrupt("safetensors: __metadata__ value is not a string", file,
                                    std::string(mk), 8);
    h.metadata.emplace(std::string(mk), std::string(s));
  }
  return ok();
}

/// The `dtype` of tensor entry `e` (named `key`): a string naming a dtype cairn knows.
CAIRN_INLINE result<dtype> parse_entry_dtype(simdjson::dom::object e,
                                             const std::string& key,
                                             std::string_view file) {
  std::string_view dt;
  if (e["dtype"].get_string().get(dt))
    return format_detail::corrupt("safetensors: missing or non-string dtype", file, key, 8);
  auto parsed = dtype_from_name(dt);
  if (!parsed)
    return format_detail::fail(
        errc::corrupt, "safetensors: unknown or unsupported dtype '" + std::string(dt) + "'", file,
        key, 8);
  return *parsed;
}

/// The `shape` of tensor entry `e` (named `key`): an array of integers in
/// `[0, max_tensor_bytes]`.
CAIRN_INLINE result<shape> parse_entry_shape(simdjson::dom::object e,
                                             const std::string& key,
                                             std::string_view file) {
  simdjson::dom::array shp;
  if (e["shape"].get_array().get(shp))
    return format_detail::corrupt("safetensors: missing shape", file, key, 8);
  shape dims;
  for (simdjson::dom::element d : shp) {
    std::uint64_t x;
    if (d.get_uint64().get(x) || x > static_cast<std::uint64_t>(max_tensor_bytes))
      return format_detail::corrupt("safetensors: shape has a non-integer, negative or huge entry",
                                    file, key, 8);
    dims.push_back(static_cast<std::int64_t>(x));
  }
  return dims;
}

/// Reads `t.begin`/`t.end` from the `data_offsets` of tensor entry `e`: `[begin, end]`,
/// unsigned, ordered, ending inside the data of the file `h` describes, and spanning exactly
/// dtype × shape bytes (`t.type` and `t.dims` are already set).
CAIRN_INLINE result<void> parse_entry_offsets(simdjson::dom::object e,
                                              const header& h,
                                              std::string_view file,
                                              tensor_info& t) {
  const std::string& key = t.name;
  simdjson::dom::array offs;
  if (e["data_offsets"].get_array().get(offs) || offs.size() != 2)
    return format_detail::corrupt("safetensors: data_offsets is not [begin, end]", file, key, 8);
  if (offs.at(0).get_uint64().get(t.begin) || offs.at(1).get_uint64().get(t.end))
    return format_detail::corrupt("safetensors: data_offsets are not unsigned integers", file, key,
                                  8);
  if (t.end < t.begin)
    return format_detail::corrupt("safetensors: data_offsets end before they begin", file, key,
                                  h.data_start);
  if (t.end > h.file_size - h.data_start)
    return format_detail::corrupt("safetensors: data_offsets end at " + std::to_string(t.end) +
                                      ", past the " + std::to_string(h.file_size - h.data_start) +
                                      " bytes of data in the file",
                                  file, key, h.data_start);
  bool valid;
  std::uint64_t n = checked_nbytes(t.dims, t.type, valid);
  if (!valid || n != t.end - t.begin)
    return format_detail::corrupt("safetensors: data_offsets span " +
                                      std::to_string(t.end - t.begin) +
                                      " bytes but dtype x shape needs " + std::to_string(n),
                                  file, key, h.data_start + t.begin);
  return ok();
}

/// Parses tensor entry `key` (`v`) of the header `h` is being read into: an object with dtype,
/// shape and data_offsets (see `parse_entry_offsets`).
CAIRN_INLINE result<tensor_info> parse_tensor_entry(simdjson::dom::element v,
                                                    const std::string& key,
                                                    const header& h,
                                                    std::string_view file) {
  simdjson::dom::object e;
  if (v.get_object().get(e))
    return format_detail::corrupt("safetensors: tensor entry is not an object", file, key, 8);
  tensor_info t;
  t.name = key;
  CAIRN_TRY_ASSIGN(t.type, parse_entry_dtype(e, key, file));
  CAIRN_TRY_ASSIGN(t.dims, parse_entry_shape(e, key, file));
  CAIRN_TRY(parse_entry_offsets(e, h, file, t));
  t.data_start = h.data_start;
  return t;
}

CAIRN_INLINE result<void> parse_header_entries(std::string_view json,
                                               std::string_view file,
                                               header& h,
                                               std::string& cur_key) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object root = parser.parse(padded).get_object();
  std::set<std::string, std::less<>> seen;
  for (auto [k, v] : root) {
    cur_key = std::string(k);
    if (!seen.insert(cur_key).second)
      return format_detail::corrupt("safetensors: duplicate key in header", file, cur_key, 8);
    if (k == "__metadata__") {
      CAIRN_TRY(parse_header_metadata(v, cur_key, file, h));
      continue;
    }
    CAIRN_TRY_ASSIGN(tensor_info t, parse_tensor_entry(v, cur_key, h, file));
    h.tensors.push_back(std::move(t));
  }
  return ok();
}

CAIRN_INLINE result<void> check_data_layout(header& h, std::string_view file) {
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const tensor_info& a, const tensor_info& b) {
                     if (a.begin != b.begin) return a.begin < b.begin;
                     return a.end < b.end;
                   });
  std::uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != expect)
      return format_detail::corrupt(
          t.begin < expect ? "safetensors: tensor overlaps the previous one"
                           : "safetensors: gap before tensor (data_offsets must be contiguous)",
          file, t.name, h.data_start + t.begin);
    expect = t.end;
  }
  if (h.data_start + expect != h.file_size)
    return format_detail::corrupt("safetensors: data ends at byte " +
                                      std::to_string(h.data_start + expect) + " but the file has " +
                                      std::to_string(h.file_size) + " bytes",
                                  file, {}, std::min(h.data_start + expect, h.file_size));
  return ok();
}

}  // namespace cairn::safetensors::detail

namespace cairn::safetensors {

CAIRN_INLINE result<header> parse_header(std::string_view json,
                                         std::uint64_t file_size,
                                         std::string_view file) {
  header h;
  h.data_start = 8 + json.size();
  h.file_size = file_size;
  if (json.empty() || json.front() != '{')
    return format_detail::corrupt("safetensors: header does not start with '{'", file, {}, 8);
  if (h.data_start > file_size)
    return format_detail::corrupt("safetensors: header runs past the end of the file", file, {}, 0);
  std::string cur_key;  // the entry being parsed, named by errors simdjson throws
  try {
    CAIRN_TRY(detail::parse_header_entries(json, file, h, cur_key));
  } catch (const simdjson::simdjson_error& e) {
    return format_detail::corrupt(std::string("safetensors: malformed header JSON: ") + e.what(),
                                  file, cur_key, 8);
  } catch (const std::bad_alloc&) {
    return format_detail::fail(errc::resource, "safetensors: out of memory parsing the header",
                               file, cur_key, 8);
  }
  CAIRN_TRY(detail::check_data_layout(h, file));
  return h;
}

CAIRN_INLINE result<header> read_header(storage_ref st, std::string_view name) {
  std::string file = st.describe(name);
  CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(name));
  if (size < 8)
    return format_detail::corrupt("safetensors: file is shorter than the 8-byte header length",
                                  file, {}, 0);
  CAIRN_TRY_ASSIGN(auto len_bytes, format_detail::read_bytes(st, name, 0, 8));
  std::uint64_t n = format_detail::load_le(len_bytes.data(), 8);
  if (n > max_header_size)
    return format_detail::corrupt(
        "safetensors: header length " + std::to_string(n) + " exceeds 100000000", file, {}, 0);
  if (n > size - 8)
    return format_detail::corrupt("safetensors: header length " + std::to_string(n) +
                                      " runs past the end of the file (" + std::to_string(size) +
                                      " bytes)",
                                  file, {}, 0);
  CAIRN_TRY_ASSIGN(std::vector<std::byte> json, format_detail::read_bytes(st, name, 8, n));
  return parse_header(std::string_view(reinterpret_cast<const char*>(json.data()), json.size()),
                      size, file);
}

CAIRN_INLINE result<void> read_range(storage_ref st,
                                     std::string_view name,
                                     const header& h,
                                     std::string_view key,
                                     std::uint64_t offset,
                                     std::span<std::byte> out) {
  const tensor_info* t = h.find(key);
  if (!t)
    return format_detail::fail(errc::not_found, "safetensors: no such tensor", st.describe(name),
                               key);
  if (offset > t->nbytes() || out.size() > t->nbytes() - offset)
    return format_detail::fail(errc::invalid_argument,
                               "safetensors: byte range " + std::to_string(offset) + "+" +
                                   std::to_string(out.size()) + " is outside the tensor (" +
                                   std::to_string(t->nbytes()) + " bytes)",
                               st.describe(name), key, t->file_offset() + offset);
  if (out.empty()) return ok();
  auto r = st.read(name, t->file_offset() + offset, out);
  if (!r) return std::move(r).err().with_key(std::string(key));
  return ok();
}

CAIRN_INLINE result<void> read_tensor(storage_ref st,
                                      std::string_view name,
                                      const header& h,
                                      std::string_view key,
                                      std::span<std::byte> out) {
  const tensor_info* t = h.find(key);
  if (t && out.size() != t->nbytes())
    return format_detail::fail(errc::invalid_argument,
                               "safetensors: buffer of " + std::to_string(out.size()) +
                                   " bytes for a tensor of " + std::to_string(t->nbytes()),
                               st.describe(name), key);
  return read_range(st, name, h, key, 0, out);
}

CAIRN_INLINE std::string to_json(const index& ix) {
  std::map<std::string, std::string> meta;  // raw JSON values, sorted by key
  for (const auto& [k, v] : ix.extra_metadata) {
    std::string s;
    format_detail::json_string(s, v);
    meta[k] = s;
  }
  meta["total_size"] = std::to_string(ix.total_size);
  std::string out = "{\n  \"metadata\": {";
  bool first = true;
  for (const auto& [k, v] : meta) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    format_detail::json_string(out, k);
    out += ": " + v;
  }
  out += "\n  },\n  \"weight_map\": {";
  first = true;
  for (const auto& [k, v] : ix.weight_map) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    format_detail::json_string(out, k);
    out += ": ";
    format_detail::json_string(out, v);
  }
  out += ix.weight_map.empty() ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

CAIRN_INLINE result<std::map<std::string, shape>> sharding_offsets_from_json(
    std::string_view json, std::string_view file) {
  using namespace simdjson;
  std::map<std::string, shape> out;
  const std::string where(dcp_sharding_info_key);
  try {
    dom::parser parser;
    padded_string padded(json);
    dom::object root;
    if (parser.parse(padded).get_object().get(root))
      return format_detail::corrupt("safetensors: DCP_SHARDING_INFO is not a JSON object", file,
                                    where);
    for (auto [k, v] : root) {
      const std::string key(k);
      dom::array offs;
      if (v["saved_offsets"].get_array().get(offs))
        return format_detail::corrupt("safetensors: DCP_SHARDING_INFO has no saved_offsets list",
                                      file, key);
      shape o;
      for (dom::element e : offs) {
        std::int64_t x;
        if (e.get_int64().get(x) || x < 0)
          return format_detail::corrupt(
              "safetensors: DCP_SHARDING_INFO saved_offsets holds a value that is not a "
              "non-negative integer",
              file, key);
        o.push_back(x);
      }
      if (!out.emplace(key, std::move(o)).second)
        return format_detail::corrupt("safetensors: DCP_SHARDING_INFO names a tensor twice", file,
                                      key);
    }
  } catch (const simdjson_error& e) {
    return format_detail::corrupt(
        std::string("safetensors: DCP_SHARDING_INFO is malformed JSON: ") + e.what(), file, where);
  } catch (const std::bad_alloc&) {
    return format_detail::fail(errc::resource, "safetensors: out of memory", file);
  }
  return out;
}

CAIRN_INLINE result<index> index_from_json(std::string_view json, std::string_view file) {
  using namespace simdjson;
  index ix;
  try {
    dom::parser parser;
    padded_string padded(json);
    dom::object root = parser.parse(padded).get_object();
    dom::object meta;
    if (!root["metadata"].get_object().get(meta)) {
      for (auto [k, v] : meta) {
        if (k == "total_size") {
          std::uint64_t n;
          double d;
          if (!v.get_uint64().get(n))
            ix.total_size = n;
          else if (!v.get_double().get(d) && d >= 0 && d < 18446744073709551616.0)
            ix.total_size = static_cast<std::uint64_t>(d);
          else
            return format_detail::corrupt("safetensors index: total_size is not a number", file,
                                          "metadata.total_size");
        } else if (v.is_string()) {
          ix.extra_metadata.emplace(std::string(k), std::string(std::string_view(v)));
        }
      }
    }
    dom::object wm;
    if (root["weight_map"].get_object().get(wm))
      return format_detail::corrupt("safetensors index: missing weight_map", file, "weight_map");
    for (auto [k, v] : wm) {
      std::string_view f;
      if (v.get_string().get(f))
        return format_detail::corrupt("safetensors index: weight_map value is not a string", file,
                                      std::string(k));
      ix.weight_map.emplace(std::string(k), std::string(f));
    }
  } catch (const simdjson_error& e) {
    return format_detail::corrupt(std::string("safetensors index: malformed JSON: ") + e.what(),
                                  file);
  } catch (const std::bad_alloc&) {
    return format_detail::fail(errc::resource, "safetensors index: out of memory", file);
  }
  return ix;
}

CAIRN_INLINE result<void> write_index(storage_ref st, std::string_view name, const index& ix) {
  std::string json = to_json(ix);
  return st.put(name, format_detail::as_bytes(json));
}

CAIRN_INLINE result<index> read_index(storage_ref st, std::string_view name) {
  CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(name));
  if (size > max_index_size)
    return format_detail::fail(errc::resource,
                               "safetensors index: " + std::to_string(size) + " bytes exceed " +
                                   std::to_string(max_index_size),
                               st.describe(name));
  CAIRN_TRY_ASSIGN(std::vector<std::byte> json, format_detail::read_bytes(st, name, 0, size));
  return index_from_json(std::string_view(reinterpret_cast<const char*>(json.data()), json.size()),
                         st.describe(name));
}

}  // namespace cairn::safetensors
