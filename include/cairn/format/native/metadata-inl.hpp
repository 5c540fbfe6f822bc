// cairn/format/native/metadata-inl.hpp: the bodies of cairn/format/native/metadata.hpp (included by
// it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in fmt/format.h before fmt 11)
#include <simdjson.h>

#include <limits>

#include "cairn/format/native/index_file.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/plan/box.hpp"

namespace cairn {

CAIRN_INLINE int required_version(const checkpoint_metadata& m) {
  if (!m.index_refs.empty()) return 5;
  int v = 1;
  for (const auto& [k, t] : m.tensors)
    for (const auto& c : t.chunks) {
      if (c.where.compressed()) return 3;
      if (!c.tiles.empty()) v = 2;
    }
  for (const auto& [k, o] : m.objects)
    if (o.where.compressed()) return 3;
  if (m.common && m.common->compressed()) return 3;
  return v;
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE void json_string(fmt::memory_buffer& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        fmt::format_to(std::back_inserter(out), "\\\"");
        break;
      case '\\':
        fmt::format_to(std::back_inserter(out), "\\\\");
        break;
      case '\n':
        fmt::format_to(std::back_inserter(out), "\\n");
        break;
      case '\t':
        fmt::format_to(std::back_inserter(out), "\\t");
        break;
      case '\r':
        fmt::format_to(std::back_inserter(out), "\\r");
        break;
      default:
        if (c < 0x20)
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else
          out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

CAIRN_INLINE void json_ints(fmt::memory_buffer& out, const shape& s) {
  fmt::format_to(std::back_inserter(out), "[{}]", fmt::join(s, ","));
}

CAIRN_INLINE void json_extent(fmt::memory_buffer& out, const extent& e) {
  fmt::format_to(std::back_inserter(out),
                 "\"file\":{},\"byte_offset\":{},\"bytes\":{},\"checksums\":[", e.file,
                 e.byte_offset, e.nbytes);
  for (std::size_t i = 0; i < e.checksums.size(); ++i) {
    if (i) out.push_back(',');
    fmt::format_to(std::back_inserter(out), "\"{:016x}\"", e.checksums[i]);
  }
  out.push_back(']');
  if (e.compressed())
    fmt::format_to(std::back_inserter(out),
                   ",\"codec\":\"zstd\",\"block_offsets\":[{}],\"block_stored\":[{}]",
                   fmt::join(e.block_offsets, ","), fmt::join(e.block_stored, ","));
}

CAIRN_INLINE const char* common_kind_name(common_kind k) {
  switch (k) {
    case common_kind::scalar:
      return "scalar";
    case common_kind::vector:
      return "vector";
    case common_kind::string:
      return "string";
  }
  return "?";
}

// The members of `metadata.json`, in document order. Each writes its member followed by ",\n"
// (the checksum member, written by `to_json`, comes last).

/// The document's identity: format, version, world size, save id, block size, checksum kind,
/// and the format when foreign (as the internal member "layout").
CAIRN_INLINE void json_identity(fmt::memory_buffer& out, const checkpoint_metadata& m) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"format\":\"cairn\",\n\"version\":{},\n\"world_size\":{},\n\"save_id\":",
                 m.version, m.world_size);
  json_string(out, m.save_id);
  fmt::format_to(o, ",\n\"block_size\":{},\n\"checksum\":\"{}\",\n", m.block_size,
                 m.verified() ? "xxh3-64" : "none");
  if (m.format != "cairn") {
    fmt::format_to(o, "\"layout\":");
    json_string(out, m.format);
    fmt::format_to(o, ",\n");
  }
}

/// `"inline_commons"`: each value's kind, dtype and bytes in hex (nothing when there are none).
CAIRN_INLINE void json_inline_commons(fmt::memory_buffer& out,
                                      const std::map<std::string, common_value>& commons) {
  if (commons.empty()) return;
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"inline_commons\":{{");
  bool first = true;
  for (const auto& [path, c] : commons) {
    fmt::format_to(o, "{}\n", first ? "" : ",");
    first = false;
    json_string(out, path);
    fmt::format_to(o, ":{{\"kind\":\"{}\",\"dtype\":\"{}\",\"hex\":\"", common_kind_name(c.kind),
                   dtype_name(c.type));
    for (std::byte b : c.data) fmt::format_to(o, "{:02x}", static_cast<unsigned>(b));
    fmt::format_to(o, "\"}}");
  }
  fmt::format_to(o, "}},\n");
}

/// `"files"`: one line per data, common-state or index file (roles since format version 4).
CAIRN_INLINE void json_files(fmt::memory_buffer& out,
                             const std::vector<file_record>& files,
                             int version) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"files\":[");
  for (std::size_t i = 0; i < files.size(); ++i) {
    fmt::format_to(o, "{}\n{{\"name\":", i ? "," : "");
    json_string(out, files[i].name);
    fmt::format_to(o, ",\"rank\":{},\"bytes\":{}", files[i].rank, files[i].nbytes);
    if (version >= 4 && files[i].role == file_role::common)
      fmt::format_to(o, ",\"role\":\"common\"");
    if (version >= 4 && files[i].role == file_role::index)
      fmt::format_to(o, ",\"role\":\"index\",\"checksum\":\"{:016x}\"", files[i].checksum);
    out.push_back('}');
  }
  fmt::format_to(o, "],\n");
}

/// `"content_metadata"`: the user's string map, on one line.
CAIRN_INLINE void json_content_metadata(fmt::memory_buffer& out,
                                        const std::map<std::string, std::string>& content) {
  fmt::format_to(std::back_inserter(out), "\"content_metadata\":{{");
  bool first = true;
  for (const auto& [k, v] : content) {
    if (!first) out.push_back(',');
    first = false;
    json_string(out, k);
    out.push_back(':');
    json_string(out, v);
  }
  fmt::format_to(std::back_inserter(out), "}},\n");
}

/// One chunk of a tensor: its box, its tiles when cut, and its extent.
CAIRN_INLINE void json_chunk(fmt::memory_buffer& out, const chunk_record& c) {
  auto o = std::back_inserter(out);
  out.push_back('{');
  fmt::format_to(o, "\"offset\":");
  json_ints(out, c.region.offset);
  fmt::format_to(o, ",\"shape\":");
  json_ints(out, c.region.size);
  if (!c.tiles.empty()) {
    fmt::format_to(o, ",\"tiles\":");
    json_ints(out, c.tiles);
  }
  out.push_back(',');
  json_extent(out, c.where);
  out.push_back('}');
}

/// `"tensors"`: one line per tensor, with its dtype, global shape and chunks, or where its
/// chunks are (`"index"`, format version 4).
CAIRN_INLINE void json_tensors(fmt::memory_buffer& out,
                               const std::map<std::string, tensor_record>& tensors,
                               const std::map<std::string, index_ref>& refs) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"tensors\":{{");
  bool first = true;
  for (const auto& [key, t] : tensors) {
    fmt::format_to(o, "{}\n", first ? "" : ",");
    first = false;
    json_string(out, key);
    fmt::format_to(o, ":{{\"dtype\":\"{}\",\"shape\":", dtype_name(t.type));
    json_ints(out, t.global_shape);
    if (auto r = refs.find(key); r != refs.end()) {
      fmt::format_to(o,
                     ",\"index\":{{\"file\":{},\"offset\":{},\"length\":{},\"checksum\":"
                     "\"{:016x}\",\"chunks\":{}}}}}",
                     r->second.file, r->second.offset, r->second.length, r->second.checksum,
                     r->second.chunks);
      continue;
    }
    fmt::format_to(o, ",\"chunks\":[");
    for (std::size_t i = 0; i < t.chunks.size(); ++i) {
      if (i) out.push_back(',');
      json_chunk(out, t.chunks[i]);
    }
    fmt::format_to(o, "]}}");
  }
  fmt::format_to(o, "}},\n");
}

/// `"objects"`: one line per sharded object, by unique key.
CAIRN_INLINE void json_objects(fmt::memory_buffer& out,
                               const std::map<std::string, object_record>& objects) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"objects\":{{");
  bool first = true;
  for (const auto& [ukey, ob] : objects) {
    fmt::format_to(o, "{}\n", first ? "" : ",");
    first = false;
    json_string(out, ukey);
    fmt::format_to(o, ":{{\"key\":");
    json_string(out, ob.key);
    fmt::format_to(o, ",\"global_shape\":");
    json_ints(out, ob.global_shape);
    fmt::format_to(o, ",\"global_offset\":");
    json_ints(out, ob.global_offset);
    out.push_back(',');
    json_extent(out, ob.where);
    out.push_back('}');
  }
  fmt::format_to(o, "}},\n");
}

/// `"common"`: the common-state extent and one line per value in it, or null.
CAIRN_INLINE void json_common(fmt::memory_buffer& out,
                              const std::optional<extent>& common,
                              const std::map<std::string, common_record>& commons) {
  auto o = std::back_inserter(out);
  fmt::format_to(o, "\"common\":");
  if (!common) {
    fmt::format_to(o, "null");
  } else {
    out.push_back('{');
    json_extent(out, *common);
    fmt::format_to(o, ",\"values\":{{");
    bool first = true;
    for (const auto& [path, c] : commons) {
      fmt::format_to(o, "{}\n", first ? "" : ",");
      first = false;
      json_string(out, path);
      fmt::format_to(o, ":{{\"kind\":\"{}\",\"dtype\":\"{}\",\"offset\":{},\"bytes\":{}}}",
                     common_kind_name(c.kind), dtype_name(c.type), c.offset, c.nbytes);
    }
    fmt::format_to(o, "}}}}");
  }
  fmt::format_to(o, ",\n");
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE std::string to_json(const checkpoint_metadata& m) {
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "{{\n");
  detail::json_identity(out, m);
  detail::json_inline_commons(out, m.inline_commons);
  detail::json_files(out, m.files, m.version);
  detail::json_content_metadata(out, m.content_metadata);
  detail::json_tensors(out, m.tensors, m.index_refs);
  detail::json_objects(out, m.objects);
  detail::json_common(out, m.common, m.commons);
  // The document's own checksum, last: XXH3-64 of every byte before its member.
  const std::uint64_t self = checksum(std::as_bytes(std::span(out.data(), out.size())));
  fmt::format_to(std::back_inserter(out), "{}\"{}\"\n}}\n", metadata_checksum_member,
                 checksum_hex(self));
  return fmt::to_string(out);
}

CAIRN_INLINE std::string reseal_metadata_json(std::string_view json) {
  std::string body(json);
  if (std::size_t at = body.rfind(metadata_checksum_member); at != std::string::npos) {
    body.resize(at);
  } else {
    std::size_t end = body.find_last_not_of(" \t\r\n");  // the closing brace
    body.resize(end == std::string::npos ? 0 : end);
    body.resize(body.find_last_not_of(" \t\r\n") + 1);
    body += ",\n";
  }
  const std::uint64_t self = checksum(std::as_bytes(std::span(body.data(), body.size())));
  return body + std::string(metadata_checksum_member) + "\"" + checksum_hex(self) + "\"\n}\n";
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE bool extent_inside_file(const checkpoint_metadata& m, const extent& e) {
  if (e.file >= m.files.size()) return false;
  const std::uint64_t size = m.files[e.file].nbytes;
  if (!e.compressed()) return e.byte_offset <= size && e.nbytes <= size - e.byte_offset;
  for (std::size_t b = 0; b < e.block_stored.size(); ++b) {
    if (e.block_stored[b] > m.block_size || e.block_offsets[b] > size ||
        e.block_stored[b] > size - e.block_offsets[b])
      return false;
  }
  return true;
}

CAIRN_INLINE result<void> check_tensor_chunks(const checkpoint_metadata& m,
                                              const std::string& k,
                                              const tensor_record& t,
                                              const std::string& where) {
  auto corrupt = [&](const std::string& msg) {
    return make_error(errc::corrupt, "malformed metadata: " + msg).with_file(where).with_key(k);
  };
  for (const auto& c : t.chunks) {
    if (!extent_inside_file(m, c.where))
      return corrupt("a chunk of '" + k + "' lies outside its file");
    if (c.where.nbytes != static_cast<std::uint64_t>(c.region.volume()) * dtype_size(t.type))
      return corrupt(
          "chunk " + c.region.str() + " of '" + k + "' has " + std::to_string(c.where.nbytes) +
          " bytes, its box holds " +
          std::to_string(c.region.volume() * static_cast<std::int64_t>(dtype_size(t.type))));
  }
  return ok();
}

CAIRN_INLINE result<void> flatten_tensor_tiles(const checkpoint_metadata& m,
                                               const std::string& k,
                                               tensor_record& t,
                                               const std::string& where) {
  if (std::none_of(t.chunks.begin(), t.chunks.end(),
                   [](const chunk_record& c) { return !c.tiles.empty(); }))
    return ok();
  std::vector<chunk_record> flat;
  for (auto& c : t.chunks) {
    if (c.tiles.empty()) {
      flat.push_back(std::move(c));
      continue;
    }
    std::uint64_t off = c.where.byte_offset;
    std::size_t i = 0;
    bool too_big = false;
    const std::size_t es = dtype_size(t.type);  // not `t` in the lambda: clang < 16
    const std::uint64_t block_size = m.block_size;
    for_each_tile(c.region, c.tiles, [&](const box& tile) {
      std::uint64_t n = static_cast<std::uint64_t>(tile.volume()) * es;
      too_big = too_big || n > block_size;
      extent te{c.where.file, off, n, {c.where.checksums[i]}, {}, {}};
      if (c.where.compressed()) {
        te.byte_offset = c.where.block_offsets[i];
        te.block_offsets = {c.where.block_offsets[i]};
        te.block_stored = {c.where.block_stored[i]};
      }
      ++i;
      flat.push_back(chunk_record{tile, std::move(te), {}});
      off += n;
    });
    if (too_big)
      return make_error(errc::corrupt, "malformed metadata: a tile of chunk " + c.region.str() +
                                           " of '" + k + "' is larger than block_size")
          .with_file(where)
          .with_key(k);
  }
  t.chunks = std::move(flat);
  return ok();
}

/// The pieces of `metadata_from_json`, one per record of the document. simdjson reports a
/// member of the wrong type by throwing `simdjson_error`; `metadata_from_json` catches it.
class metadata_json_reader {
 public:
  metadata_json_reader(const std::string& where, checkpoint_metadata& m) : where_(where), m_(m) {}

  /// errc::corrupt naming the file.
  error corrupt(const std::string& msg) const {
    return make_error(errc::corrupt, "malformed metadata: " + msg).with_file(where_);
  }

  /// The document's checksum, first: a flipped digit in an offset or a key must not load.
  result<void> check_checksum(std::string_view json) const;

  /// format, version, world_size, save_id, block_size and the checksum algorithm (a foreign
  /// format's description, `allow_unverified`, carries none, and its inline common values).
  result<void> header(simdjson::dom::element doc, bool allow_unverified);

  /// One of a foreign layout's inline common values: kind, dtype and hex bytes.
  result<void> inline_common(std::string_view k, simdjson::dom::element v);

  /// A common value's "kind" and "dtype" members.
  result<void> kind_and_dtype(simdjson::dom::element v,
                              std::string_view path,
                              common_kind& kind,
                              dtype& type) const;

  /// An extent. `blocks`: the checksum count it must have (by default one per block). Problems
  /// are collected in `bad()` (reported once the whole document is read).
  extent read_extent(simdjson::dom::object e, std::int64_t blocks = -1);

  /// The `files` list and the content metadata.
  result<void> files(simdjson::dom::element doc);

  /// One chunk of tensor `k`: its box inside the tensor, its tiles, its extent.
  result<chunk_record> chunk(std::string_view k, const tensor_record& t, simdjson::dom::object c);

  /// One tensor record: dtype, shape (checked against overflow) and chunks.
  result<void> tensor(std::string_view k, simdjson::dom::element v);

  /// Where tensor `k`'s chunks are: a section of an index file, inside that file's body.
  result<void> index_section_ref(std::string_view k, simdjson::dom::object v);

  /// The sharded objects and the common state with its values.
  result<void> objects_and_common(simdjson::dom::element doc);

  /// Every extent must lie inside its file, and every chunk inside its tensor with exactly the
  /// bytes its box holds: a reader copies chunks into user memory on these numbers.
  result<void> check_bounds() const;

  /// Readers see every tile as a chunk of its own, with its one checksum.
  result<void> flatten_tiles();

  /// Objects and the common state inside their files; common values inside the common state.
  result<void> check_objects_and_common() const;

 private:
  static shape ints(simdjson::dom::element e);
  const std::string& where_;
  checkpoint_metadata& m_;
  std::string bad_;
};

CAIRN_INLINE result<void> metadata_json_reader::check_checksum(std::string_view json) const {
  std::size_t at = json.rfind(metadata_checksum_member);
  if (at == std::string_view::npos) return ok();
  std::string_view rest = json.substr(at + metadata_checksum_member.size());
  std::optional<std::uint64_t> want;
  if (rest.size() >= 18 && rest[0] == '"' && rest[17] == '"')
    want = parse_checksum_hex(rest.substr(1, 16));
  if (!want) return corrupt("unreadable metadata_checksum");
  if (checksum(std::as_bytes(std::span(json.data(), at))) != *want)
    return make_error(errc::corrupt,
                      "metadata checksum mismatch: metadata.json was changed or damaged after "
                      "it was written")
        .with_file(where_);
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::header(simdjson::dom::element doc,
                                                       bool allow_unverified) {
  if (std::string_view(doc["format"]) != "cairn") return corrupt("\"format\" is not \"cairn\"");
  std::int64_t version = doc["version"];
  if (version > format_version)
    return make_error(errc::unsupported_version,
                      "checkpoint has format version " + std::to_string(version) +
                          "; this cairn reads versions up to " + std::to_string(format_version) +
                          ": upgrade cairn")
        .with_file(where_);
  if (version < 1) return corrupt("bad version " + std::to_string(version));
  m_.version = static_cast<int>(version);
  std::int64_t world = doc["world_size"];
  if (world < 0 || world > (std::int64_t{1} << 30))
    return corrupt("bad world_size " + std::to_string(world));
  m_.world_size = static_cast<int>(world);
  m_.save_id = std::string(std::string_view(doc["save_id"]));
  m_.block_size = std::uint64_t(doc["block_size"]);
  std::string_view checksum_name = doc["checksum"];
  if (checksum_name == "none" && allow_unverified) {
    // A foreign format described in cairn's terms (what load broadcasts): no checksums.
    std::string_view layout = doc["layout"];
    if (layout == "cairn") return corrupt("the native format without checksums");
    m_.format = std::string(layout);
    simdjson::dom::object ic;
    if (doc["inline_commons"].get(ic) == simdjson::SUCCESS)
      for (auto [k, v] : ic) CAIRN_TRY(inline_common(k, v));
  } else if (checksum_name != "xxh3-64") {
    return make_error(errc::unsupported_version,
                      "checksum algorithm '" + std::string(checksum_name) +
                          "' is not supported (this cairn knows xxh3-64)")
        .with_file(where_);
  }
  if (m_.block_size == 0 || m_.block_size > max_block_size)
    return corrupt("block_size " + std::to_string(m_.block_size) + " is outside [1, " +
                   std::to_string(max_block_size) + "]");
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::inline_common(std::string_view k,
                                                              simdjson::dom::element v) {
  common_value c;
  CAIRN_TRY(kind_and_dtype(v, k, c.kind, c.type));
  std::string_view hex = v["hex"];
  auto nibble = [](char h) {
    return h >= '0' && h <= '9'   ? h - '0'
           : h >= 'a' && h <= 'f' ? h - 'a' + 10
           : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                  : -1;
  };
  if (hex.size() % 2) return corrupt("odd-length hex for common value '" + std::string(k) + "'");
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return corrupt("bad hex for common value '" + std::string(k) + "'");
    c.data.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  m_.inline_commons.emplace(std::string(k), std::move(c));
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::kind_and_dtype(simdjson::dom::element v,
                                                               std::string_view path,
                                                               common_kind& kind,
                                                               dtype& type) const {
  std::string_view k = v["kind"];
  if (k == "scalar")
    kind = common_kind::scalar;
  else if (k == "vector")
    kind = common_kind::vector;
  else if (k == "string")
    kind = common_kind::string;
  else
    return corrupt("unknown common kind '" + std::string(k) + "'");
  auto dt = dtype_from_name(std::string_view(v["dtype"]));
  if (!dt) return corrupt("unknown dtype for common value '" + std::string(path) + "'");
  type = *dt;
  return ok();
}

CAIRN_INLINE extent metadata_json_reader::read_extent(simdjson::dom::object e,
                                                      std::int64_t blocks) {
  extent x;
  std::uint64_t file = e["file"];
  if (file > std::numeric_limits<std::uint32_t>::max()) bad_ = "file index out of range";
  x.file = static_cast<std::uint32_t>(file);
  x.byte_offset = std::uint64_t(e["byte_offset"]);
  x.nbytes = std::uint64_t(e["bytes"]);
  for (simdjson::dom::element c : simdjson::dom::array(e["checksums"])) {
    auto v = parse_checksum_hex(std::string_view(c));
    if (!v) bad_ = "bad checksum string";
    x.checksums.push_back(v.value_or(0));
  }
  if (blocks < 0)
    blocks = static_cast<std::int64_t>(x.nbytes / m_.block_size + (x.nbytes % m_.block_size != 0));
  std::int64_t data_blocks = blocks;
  if (!m_.verified()) blocks = 0;
  if (x.checksums.size() != static_cast<std::uint64_t>(blocks))
    bad_ = "checksum count does not match the byte count";
  std::string_view codec;
  if (e["codec"].get(codec) == simdjson::SUCCESS) {
    if (codec != "zstd") {
      bad_ = "unknown codec '" + std::string(codec) + "'";
      return x;
    }
    for (simdjson::dom::element v : simdjson::dom::array(e["block_offsets"]))
      x.block_offsets.push_back(std::uint64_t(v));
    for (simdjson::dom::element v : simdjson::dom::array(e["block_stored"]))
      x.block_stored.push_back(std::uint64_t(v));
    if (x.block_offsets.size() != static_cast<std::uint64_t>(data_blocks) ||
        x.block_stored.size() != x.block_offsets.size() || x.block_stored.empty())
      bad_ = "block_offsets / block_stored do not match the block count";
  }
  return x;
}

CAIRN_INLINE result<void> metadata_json_reader::files(simdjson::dom::element doc) {
  for (simdjson::dom::object f : simdjson::dom::array(doc["files"])) {
    file_record r;
    r.name = std::string(std::string_view(f["name"]));
    std::int64_t rank = f["rank"];
    if (rank < 0 || rank > (std::int64_t{1} << 30)) return corrupt("bad file rank");
    r.rank = static_cast<int>(rank);
    r.nbytes = std::uint64_t(f["bytes"]);
    std::string_view role;
    if (f["role"].get(role) == simdjson::SUCCESS) {
      if (m_.version < 4) return corrupt("file roles before format version 4");
      if (role == "common") {
        r.role = file_role::common;
      } else if (role == "index") {
        r.role = file_role::index;
        auto sum = parse_checksum_hex(std::string_view(f["checksum"]));
        if (!sum) return corrupt("bad checksum of index file '" + r.name + "'");
        r.checksum = *sum;
      } else if (role != "data") {
        return corrupt("unknown file role '" + std::string(role) + "'");
      }
    }
    m_.files.push_back(std::move(r));
  }
  for (auto [k, v] : simdjson::dom::object(doc["content_metadata"]))
    m_.content_metadata.emplace(std::string(k), std::string(std::string_view(v)));
  return ok();
}

CAIRN_INLINE result<chunk_record> metadata_json_reader::chunk(std::string_view k,
                                                              const tensor_record& t,
                                                              simdjson::dom::object c) {
  chunk_record cr;
  cr.region.offset = ints(c["offset"]);
  cr.region.size = ints(c["shape"]);
  if (cr.region.offset.size() != t.global_shape.size() ||
      cr.region.size.size() != t.global_shape.size())
    return corrupt("chunk rank differs from tensor rank for '" + std::string(k) + "'");
  // Inside the tensor before anything is computed from it (sizes then cannot overflow).
  for (std::size_t a = 0; a < t.global_shape.size(); ++a)
    if (cr.region.offset[a] < 0 || cr.region.size[a] < 0 || cr.region.size[a] > t.global_shape[a] ||
        cr.region.offset[a] > t.global_shape[a] - cr.region.size[a])
      return corrupt("chunk " + cr.region.str() + " of '" + std::string(k) +
                     "' lies outside the tensor");
  simdjson::dom::element tiles;
  if (c["tiles"].get(tiles) == simdjson::SUCCESS) {
    if (!m_.verified()) return corrupt("an unverified format has tiled chunks");
    cr.tiles = ints(tiles);
    if (cr.tiles.size() != cr.region.size.size())
      return corrupt("tile counts of a chunk of '" + std::string(k) + "' have the wrong rank");
    for (std::size_t a = 0; a < cr.tiles.size(); ++a)
      if (cr.tiles[a] < 1 || cr.region.size[a] < 0 ||
          (cr.region.size[a] > 0 && cr.tiles[a] > cr.region.size[a]))
        return corrupt("bad tile counts for a chunk of '" + std::string(k) + "'");
  }
  cr.where = read_extent(c, cr.tiles.empty() ? -1 : tile_count(cr.region, cr.tiles));
  return cr;
}

CAIRN_INLINE result<void> metadata_json_reader::tensor(std::string_view k,
                                                       simdjson::dom::element v) {
  tensor_record t;
  auto dt = dtype_from_name(std::string_view(v["dtype"]));
  if (!dt) return corrupt("unknown dtype for tensor '" + std::string(k) + "'");
  t.type = *dt;
  t.global_shape = ints(v["shape"]);
  if (!checked_numel(t.global_shape, dtype_size(t.type)))
    return corrupt("tensor '" + std::string(k) + "' has a negative extent or more than 2^62 bytes");
  simdjson::dom::object index;
  if (v["index"].get(index) == simdjson::SUCCESS) {
    if (m_.version < 4) return corrupt("an index section before format version 4");
    CAIRN_TRY(index_section_ref(k, index));
  } else {
    for (simdjson::dom::object c : simdjson::dom::array(v["chunks"])) {
      CAIRN_TRY_ASSIGN(chunk_record cr, chunk(k, t, c));
      t.chunks.push_back(std::move(cr));
    }
  }
  m_.tensors.emplace(std::string(k), std::move(t));
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::index_section_ref(std::string_view k,
                                                                  simdjson::dom::object v) {
  index_ref r;
  std::uint64_t file = v["file"];
  r.offset = std::uint64_t(v["offset"]);
  r.length = std::uint64_t(v["length"]);
  r.chunks = std::uint64_t(v["chunks"]);
  auto sum = parse_checksum_hex(std::string_view(v["checksum"]));
  const std::string what = "the index section of '" + std::string(k) + "'";
  if (!sum) return corrupt("bad checksum of " + what);
  r.checksum = *sum;
  if (file >= m_.files.size() || m_.files[file].role != file_role::index)
    return corrupt(what + " names file " + std::to_string(file) + ", not an index file");
  r.file = static_cast<std::uint32_t>(file);
  if (!inside_index_body(r.offset, r.length, m_.files[file].nbytes))
    return corrupt(what + " lies outside the body of its file");
  m_.index_refs.emplace(std::string(k), r);
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::objects_and_common(simdjson::dom::element doc) {
  for (auto [k, v] : simdjson::dom::object(doc["objects"])) {
    object_record r;
    r.key = std::string(std::string_view(v["key"]));
    r.global_shape = ints(v["global_shape"]);
    r.global_offset = ints(v["global_offset"]);
    r.where = read_extent(simdjson::dom::object(v));
    m_.objects.emplace(std::string(k), std::move(r));
  }
  simdjson::dom::element common = doc["common"];
  if (common.is_null()) return ok();
  m_.common = read_extent(simdjson::dom::object(common));
  for (auto [k, v] : simdjson::dom::object(common["values"])) {
    common_record c;
    CAIRN_TRY(kind_and_dtype(v, k, c.kind, c.type));
    c.offset = std::uint64_t(v["offset"]);
    c.nbytes = std::uint64_t(v["bytes"]);
    m_.commons.emplace(std::string(k), c);
  }
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::check_bounds() const {
  if (!bad_.empty()) return corrupt(bad_);
  for (const auto& [k, t] : m_.tensors) CAIRN_TRY(check_tensor_chunks(m_, k, t, where_));
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::flatten_tiles() {
  for (auto& [k, t] : m_.tensors) CAIRN_TRY(flatten_tensor_tiles(m_, k, t, where_));
  return ok();
}

CAIRN_INLINE result<void> metadata_json_reader::check_objects_and_common() const {
  for (const auto& [k, o] : m_.objects)
    if (!extent_inside_file(m_, o.where))
      return corrupt("object '" + k + "' lies outside its file");
  if (!m_.common) return ok();
  if (!extent_inside_file(m_, *m_.common)) return corrupt("common state lies outside its file");
  for (const auto& [k, c] : m_.commons)
    if (c.offset > m_.common->nbytes || c.nbytes > m_.common->nbytes - c.offset)
      return corrupt("common value '" + k + "' lies outside the common state");
  return ok();
}

CAIRN_INLINE shape metadata_json_reader::ints(simdjson::dom::element e) {
  shape s;
  for (simdjson::dom::element v : simdjson::dom::array(e)) s.push_back(std::int64_t(v));
  return s;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<checkpoint_metadata> metadata_from_json(std::string_view json,
                                                            const std::string& where,
                                                            bool allow_unverified) {
  checkpoint_metadata m;
  detail::metadata_json_reader r(where, m);
  CAIRN_TRY(r.check_checksum(json));
  try {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json);
    simdjson::dom::element doc = parser.parse(padded);
    CAIRN_TRY(r.header(doc, allow_unverified));
    if (m.version >= 4 && json.rfind(metadata_checksum_member) == std::string_view::npos)
      return r.corrupt("format version 4 without its metadata_checksum");
    CAIRN_TRY(r.files(doc));
    for (auto [k, v] : simdjson::dom::object(doc["tensors"])) CAIRN_TRY(r.tensor(k, v));
    CAIRN_TRY(r.objects_and_common(doc));
    CAIRN_TRY(r.check_bounds());
    CAIRN_TRY(r.flatten_tiles());
    CAIRN_TRY(r.check_objects_and_common());
  } catch (const simdjson::simdjson_error& e) {
    return r.corrupt(e.what());
  }
  return m;
}

}  // namespace cairn
