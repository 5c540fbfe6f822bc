// cairn/format/safetensors/file.hpp: the safetensors file format (huggingface/safetensors) — a
// streaming, deterministic writer, a validating reader with byte-range reads, and the Hugging
// Face `model.safetensors.index.json`. Layout notes in docs/safetensors.md.
#pragma once

#include <simdjson.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::safetensors {

/// Largest header the reference reader accepts (`MAX_HEADER_SIZE`).
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// Largest index (`model.safetensors.index.json`) read: as large as a header may be, since an
/// index names each tensor once as a header does.
inline constexpr std::uint64_t max_index_size = max_header_size;

/// A tensor to be written: name, dtype and shape (row-major, little-endian data).
struct tensor_decl {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
};

/// One tensor of a file: `begin`/`end` are byte offsets relative to the data buffer (the
/// reference's `data_offsets`); `file_offset()` is where its bytes start in the file.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t data_start = 0;  ///< 8 + header length: start of the data buffer in the file
  /// Number of bytes of the tensor.
  std::uint64_t nbytes() const noexcept { return end - begin; }
  /// Absolute byte offset of the tensor's first byte in the file.
  std::uint64_t file_offset() const noexcept { return data_start + begin; }
};

/// A parsed (or planned) header: `__metadata__`, the tensors in data order, and sizes.
struct header {
  std::map<std::string, std::string> metadata;  ///< the `__metadata__` string map
  std::vector<tensor_info> tensors;             ///< ordered by `begin`
  std::uint64_t data_start = 0;                 ///< 8 + header length
  std::uint64_t file_size = 0;                  ///< data_start + total data bytes
  /// The tensor named `name`, or nullptr.
  const tensor_info* find(std::string_view name) const noexcept {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

namespace detail {
/// The reference writer's order key: the Rust `Dtype` enum is declared by increasing alignment
/// and files are sorted by descending dtype, then name.
constexpr int dtype_rank(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
      return 0;
    case dtype::u8:
      return 4;
    case dtype::i8:
      return 5;
    case dtype::f8_e5m2:
      return 6;
    case dtype::f8_e4m3:
      return 7;
    case dtype::i16:
      return 10;
    case dtype::u16:
      return 11;
    case dtype::f16:
      return 12;
    case dtype::bf16:
      return 13;
    case dtype::i32:
      return 14;
    case dtype::u32:
      return 15;
    case dtype::f32:
      return 16;
    case dtype::f64:
      return 18;
    case dtype::i64:
      return 19;
    case dtype::u64:
      return 20;
  }
  return 0;
}

/// Bytes of a tensor of `dims` and `t`; `ok` false for a negative extent or more than
/// `max_tensor_bytes` (see `format_detail::file_numel`).
inline std::uint64_t checked_nbytes(const shape& dims, dtype t, bool& ok) {
  auto n = format_detail::file_numel(dims, dtype_size(t));
  ok = n.has_value();
  return ok ? static_cast<std::uint64_t>(*n) * dtype_size(t) : 0;
}
}  // namespace detail

/// Lays out a file: sorts tensors as the reference writer does (`__metadata__` first, then by
/// descending dtype alignment and name), assigns `data_offsets`, and returns the header with
/// `data_start`/`file_size`. Errors on duplicate or empty names and negative dimensions.
inline result<header> plan(std::vector<tensor_decl> tensors,
                           std::map<std::string, std::string> metadata = {}) {
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

/// The header bytes of a planned file: the 8-byte little-endian length and the JSON, padded
/// with spaces to a multiple of 8 bytes. Also sets `h.data_start` and `h.file_size`.
inline std::string encode_header(header& h) {
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

/// Streams one safetensors file into an `object_writer`: the header is written at `open`, then
/// each tensor's bytes by `write` (whole tensor) or `write_at` (a byte range of a tensor, in any
/// order, disjoint ranges). Memory is bounded by what the caller passes. `finish` checks every
/// tensor was fully written and finishes the object. The same declarations and bytes always
/// give a byte-identical file.
class writer {
 public:
  /// Opens `name` on `st` and lays out `tensors`. The header is written by `finish()`, after
  /// every tensor byte: a writer killed before that leaves a file whose first 8 bytes are zero
  /// (an invalid header length), never a valid header over data with holes in it.
  static result<writer> open(storage_ref st,
                             std::string_view name,
                             std::vector<tensor_decl> tensors,
                             std::map<std::string, std::string> metadata = {}) {
    CAIRN_TRY_ASSIGN(header h, plan(std::move(tensors), std::move(metadata)));
    CAIRN_TRY_ASSIGN(auto out, st.open_writer(name));
    writer w(std::move(h), std::move(out), st.describe(name));
    w.header_bytes_ = encode_header(w.h_);  // also fixes every tensor's offset
    w.written_.assign(w.h_.tensors.size(), 0);
    return w;
  }

  /// The planned header (tensor order and offsets).
  const header& planned() const noexcept { return h_; }

  /// Writes all bytes of tensor `name` (size must equal dtype size × numel).
  result<void> write(std::string_view name, std::span<const std::byte> data) {
    CAIRN_TRY_ASSIGN(std::size_t i, index(name));
    if (data.size() != h_.tensors[i].nbytes())
      return format_detail::fail(errc::invalid_argument,
                                 "safetensors: tensor needs " +
                                     std::to_string(h_.tensors[i].nbytes()) + " bytes, got " +
                                     std::to_string(data.size()),
                                 file_, name);
    return write_at(name, 0, data);
  }

  /// Writes `data` at byte `offset` inside tensor `name`. Thread-safe for disjoint ranges.
  result<void> write_at(std::string_view name,
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

  /// Checks that every tensor received exactly its bytes, writes the header, then finishes the
  /// object.
  result<void> finish() {
    for (std::size_t i = 0; i < h_.tensors.size(); ++i)
      if (written_[i] != h_.tensors[i].nbytes())
        return format_detail::fail(errc::invalid_argument,
                                   "safetensors: tensor got " + std::to_string(written_[i]) +
                                       " of " + std::to_string(h_.tensors[i].nbytes()) + " bytes",
                                   file_, h_.tensors[i].name, h_.tensors[i].file_offset());
    if (auto w = out_->write_at(0, format_detail::as_bytes(header_bytes_)); !w)
      return std::move(w).err().with_file(file_);
    auto r = out_->finish();
    if (!r) return std::move(r).err().with_file(file_);
    return ok();
  }

 private:
  writer(header h, std::unique_ptr<object_writer> out, std::string file)
      : h_(std::move(h)), out_(std::move(out)), file_(std::move(file)) {
    for (std::size_t i = 0; i < h_.tensors.size(); ++i) by_name_.emplace(h_.tensors[i].name, i);
  }
  result<std::size_t> index(std::string_view name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end())
      return format_detail::fail(errc::not_found, "safetensors: tensor was not declared", file_,
                                 name);
    return it->second;
  }
  header h_;
  std::string header_bytes_;  // written last, by finish()
  std::unique_ptr<object_writer> out_;
  std::string file_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<std::uint64_t> written_;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();  // guards written_
};

/// A tensor and its bytes, for `write_file`.
struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::span<const std::byte> data;
};

/// Writes a whole safetensors file from tensors already in memory.
inline result<void> write_file(storage_ref st,
                               std::string_view name,
                               const std::vector<tensor_view>& tensors,
                               std::map<std::string, std::string> metadata = {}) {
  std::vector<tensor_decl> decls;
  for (const auto& t : tensors) decls.push_back({t.name, t.type, t.dims});
  CAIRN_TRY_ASSIGN(writer w, writer::open(st, name, std::move(decls), std::move(metadata)));
  for (const auto& t : tensors) CAIRN_TRY(w.write(t.name, t.data));
  return w.finish();
}

namespace detail {

/// Reads `__metadata__` (`v`, entry `key`), which must be an object of strings, into
/// `h.metadata`.
inline result<void> parse_header_metadata(simdjson::dom::element v,
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
inline result<dtype> parse_entry_dtype(simdjson::dom::object e,
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
inline result<shape> parse_entry_shape(simdjson::dom::object e,
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
inline result<void> parse_entry_offsets(simdjson::dom::object e,
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
inline result<tensor_info> parse_tensor_entry(simdjson::dom::element v,
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

/// Parses the entries of header `json` into `h` in document order (`__metadata__` and tensors),
/// rejecting a duplicate key. `cur_key` is the entry being read, for errors simdjson throws.
inline result<void> parse_header_entries(std::string_view json,
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

/// Sorts `h.tensors` by offsets and checks that they tile the data buffer from 0 without gaps
/// or overlaps and end exactly at the end of the file.
inline result<void> check_data_layout(header& h, std::string_view file) {
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

}  // namespace detail

/// Parses and validates a header (the JSON after the 8-byte length) of a file of `file_size`
/// bytes, applying every rule of the reference reader: `__metadata__` is a string map, entries
/// have a known dtype, non-negative shape and `data_offsets` whose size matches dtype × shape,
/// tile the buffer from 0 without gaps or overlaps, and end exactly at the end of the file; no
/// duplicate keys. Errors are `errc::corrupt` naming `file`, the key and a byte offset.
inline result<header> parse_header(std::string_view json,
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

/// Reads and validates the header of safetensors object `name` on `st`.
inline result<header> read_header(storage_ref st, std::string_view name) {
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

/// Reads `out.size()` bytes starting at byte `offset` of tensor `key` (a partial load).
inline result<void> read_range(storage_ref st,
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

/// Reads all bytes of tensor `key` into `out` (which must be exactly its size).
inline result<void> read_tensor(storage_ref st,
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

/// Hugging Face's sharded-checkpoint index (`model.safetensors.index.json`).
struct index {
  std::uint64_t total_size = 0;                   ///< `metadata.total_size`: bytes of all tensors
  std::map<std::string, std::string> weight_map;  ///< tensor name -> file name
  std::map<std::string, std::string> extra_metadata;  ///< other string-valued `metadata` fields
};

/// Conventional file name of the index.
inline constexpr std::string_view index_name = "model.safetensors.index.json";

/// The index as JSON, formatted as transformers writes it (`indent=2, sort_keys=True`, newline).
inline std::string to_json(const index& ix) {
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

/// Parses an index; `file` names it in errors. Unknown top-level fields are ignored.
inline result<index> index_from_json(std::string_view json, std::string_view file) {
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

/// Writes the index as object `name` (atomically, with `put`).
inline result<void> write_index(storage_ref st, std::string_view name, const index& ix) {
  std::string json = to_json(ix);
  return st.put(name, format_detail::as_bytes(json));
}

/// Reads the index object `name` (`errc::resource` past `max_index_size`).
inline result<index> read_index(storage_ref st, std::string_view name) {
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
