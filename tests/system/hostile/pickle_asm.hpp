// tests/system/hostile/pickle_asm.hpp: hand-assembled pickles (and torch.save archives around them)
// for tests of hostile input: memo sharing, reference cycles, deep nests and huge claimed sizes
// that no Python writer would produce. Pieces are pickle *bodies* (opcodes without PROTO and STOP)
// that concatenate; `program` wraps a body into a whole pickle.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/memory.hpp"

namespace pickle_asm {

namespace pk = cairn::pickle;

/// The opcodes of `v` as cairn's writer emits them (protocol 4), without PROTO and STOP.
inline std::string body(const pk::value& v) {
  std::string s = pk::dumps(v, 4);
  return s.substr(2, s.size() - 3);
}
/// A whole pickle: PROTO 4, `b`, STOP.
inline std::string program(const std::string& b) { return std::string("\x80\x04", 2) + b + "."; }
inline std::string le32(std::uint32_t x) {
  std::string s;
  cairn::format_detail::put_le(s, x, 4);
  return s;
}
/// LONG_BINPUT / LONG_BINGET of memo slot `i`.
inline std::string put(std::uint32_t i) { return "r" + le32(i); }
inline std::string get(std::uint32_t i) { return "j" + le32(i); }
inline std::string str(std::string_view s) { return body(pk::value::string(std::string(s))); }
inline std::string integer(std::int64_t x) { return body(pk::value::integer(x)); }
inline std::string global(std::string_view m, std::string_view n) {
  return "c" + std::string(m) + "\n" + std::string(n) + "\n";
}
/// `torch.Size((xs...))`.
inline std::string size(const std::vector<std::int64_t>& xs) {
  std::string s = global("torch", "Size") + "(";
  for (auto x : xs) s += integer(x);
  return s + "t\x85R";
}
/// A dataclass as Python pickles one: NEWOBJ of the class, then BUILD with the field dict.
inline std::string dataclass(std::string_view module,
                             std::string_view name,
                             const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string s = global(module, name) + ")\x81}(";
  for (const auto& [k, v] : fields) s += str(k) + v;
  return s + "ub";
}
/// A dict body from (key body, value body) pairs.
inline std::string dict(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string s = "}(";
  for (const auto& [k, v] : entries) s += k + v;
  return s + "u";
}

inline constexpr std::string_view md = "torch.distributed.checkpoint.metadata";
inline constexpr std::string_view fs = "torch.distributed.checkpoint.filesystem";

/// A valid TensorProperties of `type` (as cairn's DCP writer emits it).
inline std::string properties(cairn::dtype type) {
  cairn::dcp::metadata m;
  m.state_dict_metadata["w"] = cairn::dcp::tensor_meta{type, {1}, {{{0}, {1}}}};
  pk::value v = cairn::dcp::to_value(m);
  return body(*v.obj->state.get("state_dict_metadata")->get("w")->obj->attr("properties"));
}
/// A TensorStorageMetadata with the given size and chunks bodies.
inline std::string tensor_meta(cairn::dtype type, std::string size_body, std::string chunks_body) {
  return dataclass(md, "TensorStorageMetadata",
                   {{"properties", properties(type)},
                    {"size", std::move(size_body)},
                    {"chunks", std::move(chunks_body)}});
}
inline std::string chunk(const std::vector<std::int64_t>& offsets,
                         const std::vector<std::int64_t>& sizes) {
  return dataclass(md, "ChunkStorageMetadata",
                   {{"offsets", size(offsets)}, {"sizes", size(sizes)}});
}
/// `storage_data` entry key and value bodies: MetadataIndex(fqn, Size(offsets)) ->
/// _StorageInfo(path, offset, length).
inline std::pair<std::string, std::string> storage_entry(std::string_view fqn,
                                                         const std::vector<std::int64_t>& offsets,
                                                         std::string_view path,
                                                         std::int64_t offset,
                                                         std::int64_t length) {
  return {dataclass(md, "MetadataIndex",
                    {{"fqn", str(fqn)}, {"offset", size(offsets)}, {"index", "N"}}),
          dataclass(fs, "_StorageInfo",
                    {{"relative_path", str(path)},
                     {"offset", integer(offset)},
                     {"length", integer(length)}})};
}
/// A whole `.metadata` pickle from the bodies of its three dicts.
inline std::string metadata(std::string sdm, std::string storage_data, std::string planner = "}") {
  return program(dataclass(md, "Metadata",
                           {{"state_dict_metadata", std::move(sdm)},
                            {"planner_data", std::move(planner)},
                            {"storage_data", std::move(storage_data)}}));
}

/// `_rebuild_tensor_v2(('storage', FloatStorage-of-`type`, key, 'cpu', numel), offset, dims,
/// strides, False, OrderedDict())` with whatever sizes the test claims.
inline pk::value tensor_v2(cairn::dtype type,
                           const std::vector<std::int64_t>& dims,
                           const std::vector<std::int64_t>& strides,
                           std::int64_t storage_offset = 0,
                           std::int64_t storage_numel = 1) {
  using pk::value;
  std::vector<value> d, s;
  for (auto x : dims) d.push_back(value::integer(x));
  for (auto x : strides) s.push_back(value::integer(x));
  value pid =
      value::tuple({value::string("storage"),
                    value::global("torch", std::string(cairn::torch_zip::storage_class(type))),
                    value::string("0"), value::string("cpu"), value::integer(storage_numel)});
  value hooks = value::instance("collections", "OrderedDict", value::tuple(), value(), false);
  return value::instance(
      "torch._utils", "_rebuild_tensor_v2",
      value::tuple({value::persistent(std::move(pid)), value::integer(storage_offset),
                    value::tuple(std::move(d)), value::tuple(std::move(s)), value::boolean(false),
                    std::move(hooks)}),
      value(), false);
}

/// Appends a `torch.save` archive at `base` of `w` whose `data.pkl` is the raw pickle `pkl`
/// and whose storage `data/0` holds `storage`; returns its length.
inline std::uint64_t raw_archive(cairn::object_writer& w,
                                 std::uint64_t base,
                                 const std::string& pkl,
                                 std::string_view storage,
                                 std::string prefix = "archive") {
  cairn::torch_zip::zip_writer z(w, base);
  z.add(prefix + "/data.pkl", cairn::format_detail::as_bytes(pkl)).value();
  z.add(prefix + "/data/0", cairn::format_detail::as_bytes(storage)).value();
  z.add(prefix + "/version", cairn::format_detail::as_bytes("3\n")).value();
  return z.finish().value();
}
/// Writes object `name` on `m` as one such archive; returns its size.
inline std::uint64_t put_archive(cairn::memory_storage& m,
                                 std::string_view name,
                                 const std::string& pkl,
                                 std::string_view storage = std::string_view("\0\0\0\0", 4)) {
  auto w = m.open_writer(name).value();
  std::uint64_t n = raw_archive(*w, 0, pkl, storage);
  w->finish().value();
  return n;
}
/// Stores `bytes` as object `name`.
inline void put(cairn::memory_storage& m, std::string_view name, const std::string& bytes) {
  m.put(name, cairn::format_detail::as_bytes(bytes)).value();
}

}  // namespace pickle_asm
