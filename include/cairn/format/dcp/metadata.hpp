// cairn/format/dcp/metadata.hpp: PyTorch Distributed Checkpoint's `.metadata` pickle — build it
// from plain structs (torch 2.x or torch 1.13 module paths) and parse it from any torch version,
// tolerating unknown classes and extra fields (StorageMeta, transform_descriptors, Megatron's
// MCoreMetadata subclass). Layout notes in docs/torch-formats.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::dcp {

/// Name of the metadata object in a DCP checkpoint directory.
inline constexpr std::string_view metadata_name = ".metadata";

/// One saved chunk of a tensor: `ChunkStorageMetadata(offsets, sizes)`.
struct chunk {
  shape offsets;
  shape sizes;
  friend bool operator==(const chunk&, const chunk&) = default;
};

/// `TensorStorageMetadata`: dtype (from TensorProperties), global size and chunks.
struct tensor_meta {
  dtype type = dtype::f32;
  shape size;
  std::vector<chunk> chunks;
  bool requires_grad = false;
};

/// `BytesStorageMetadata`: a non-tensor item saved with `torch.save`.
struct bytes_meta {};

/// `MetadataIndex(fqn, offset, index)`: the key of `storage_data`. `offset` is the chunk's
/// offsets for tensors and absent for bytes items.
struct index {
  std::string fqn;
  std::optional<shape> offset;
  std::optional<std::int64_t> hint;  ///< `index`, only a lookup hint
};

/// `_StorageInfo`: the byte range of an item's `torch.save` blob inside a `.distcp` file.
struct storage_info {
  std::string relative_path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// A DCP checkpoint's metadata. Maps keep fqn order sorted, so the pickle is deterministic.
struct metadata {
  std::map<std::string, std::variant<tensor_meta, bytes_meta>> state_dict_metadata;
  /// `planner_data`: fqn -> flattening path (strings, or ints for list indices). Written as a
  /// dict, never None (`_EmptyStateDictLoadPlanner` tests `k in planner_data`).
  std::map<std::string, std::vector<pickle::value>> planner_data;
  std::vector<std::pair<index, storage_info>> storage_data;
  std::optional<std::string> version;  ///< `version` ("1.0.0"); written only when set
  /// What the reader found and did not interpret (e.g. `mcore_data`, `storage_meta`), by
  /// attribute name; ignored by the writer.
  std::map<std::string, pickle::value> extras;
  std::string class_module, class_name;  ///< the Metadata class that was read

  /// The storage_info of item (fqn, offset), or nullptr.
  const storage_info* find(std::string_view fqn, const std::optional<shape>& offset) const {
    for (const auto& [k, v] : storage_data)
      if (k.fqn == fqn && k.offset == offset) return &v;
    return nullptr;
  }
};

/// Which module paths the writer names.
enum class flavor {
  /// torch >= 2.0: `torch.distributed.checkpoint.{metadata,filesystem}`, TensorProperties from
  /// `torch.distributed._shard.sharded_tensor.metadata` (loads on every 2.x).
  torch2,
  /// torch 1.13's prototype: `torch.distributed._shard.checkpoint.{metadata,filesystem}`.
  torch1_13,
};

/// Checks the save-time invariants of `_validate_global_plan`: every chunk lies inside the
/// tensor, chunks do not overlap, and their volumes sum to the tensor's volume.
inline result<void> validate(const metadata& m) {
  for (const auto& [fqn, item] : m.state_dict_metadata) {
    const auto* t = std::get_if<tensor_meta>(&item);
    if (!t) continue;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < t->chunks.size(); ++i) {
      const chunk& c = t->chunks[i];
      if (c.offsets.size() != t->size.size() || c.sizes.size() != t->size.size())
        return make_error(errc::integrity, "dcp: chunk rank differs from the tensor's")
            .with_key(fqn);
      if (!format_detail::file_numel(t->size, dtype_size(t->type)))
        return std::move(
                   make_error(errc::invalid_argument, "dcp: tensor size has more than 2^62 bytes"))
            .with_key(fqn);
      for (std::size_t a = 0; a < c.sizes.size(); ++a)
        if (c.offsets[a] < 0 || c.sizes[a] < 0 || c.offsets[a] > t->size[a] ||
            c.sizes[a] > t->size[a] - c.offsets[a])
          return make_error(errc::integrity, "dcp: chunk lies outside the tensor").with_key(fqn);
      total += numel(c.sizes);
      for (std::size_t j = 0; j < i; ++j) {
        const chunk& o = t->chunks[j];
        bool overlap = true;
        for (std::size_t a = 0; a < c.sizes.size(); ++a)
          if (c.offsets[a] >= o.offsets[a] + o.sizes[a] ||
              o.offsets[a] >= c.offsets[a] + c.sizes[a])
            overlap = false;
        if (overlap && numel(c.sizes) > 0 && numel(o.sizes) > 0)
          return make_error(errc::integrity, "dcp: chunks overlap").with_key(fqn);
      }
    }
    if (total != numel(t->size))
      return make_error(errc::integrity, "dcp: chunks cover " + std::to_string(total) + " of " +
                                             std::to_string(numel(t->size)) + " elements")
          .with_key(fqn);
  }
  return ok();
}

namespace detail {
using pickle::value;
inline value ints_tuple(const shape& s) {
  std::vector<value> xs;
  for (auto x : s) xs.push_back(value::integer(x));
  return value::tuple(std::move(xs));
}
inline value torch_size(const shape& s) {
  return value::instance("torch", "Size", value::tuple({ints_tuple(s)}), value(), false);
}
inline value dataclass(std::string module,
                       std::string name,
                       std::vector<std::pair<std::string, value>> fields) {
  std::vector<std::pair<value, value>> es;
  for (auto& [k, v] : fields) es.emplace_back(value::string(k), std::move(v));
  return value::instance(std::move(module), std::move(name), value::tuple(),
                         es.empty() ? value() : value::dict(std::move(es)), true);
}
}  // namespace detail

/// The `.metadata` object tree for `m` with `f`'s module paths: dataclasses as NEWOBJ + BUILD
/// of their field dict, TensorProperties with its 5-tuple state, `torch.Size` and `torch.<dtype>`
/// globals, `torch.serialization._get_layout('torch.strided')`. Only classes that exist in the
/// target torch are named (`storage_meta` is written as None).
inline pickle::value to_value(const metadata& m, flavor f = flavor::torch2) {
  using detail::dataclass;
  using pickle::value;
  const std::string md = f == flavor::torch2 ? "torch.distributed.checkpoint.metadata"
                                             : "torch.distributed._shard.checkpoint.metadata";
  const std::string fs = f == flavor::torch2 ? "torch.distributed.checkpoint.filesystem"
                                             : "torch.distributed._shard.checkpoint.filesystem";
  const std::string tp = "torch.distributed._shard.sharded_tensor.metadata";
  std::vector<std::pair<value, value>> sdm;
  for (const auto& [fqn, item] : m.state_dict_metadata) {
    value v;
    if (const auto* t = std::get_if<tensor_meta>(&item)) {
      value layout =
          value::instance("torch.serialization", "_get_layout",
                          value::tuple({value::string("torch.strided")}), value(), false);
      value mem = value::instance(tp, "MEM_FORMAT_ENCODING", value::tuple({value::integer(0)}),
                                  value(), false);
      value props = value::instance(
          tp, "TensorProperties", value::tuple(),
          value::tuple({value::global("torch", std::string(torch_zip::torch_dtype_name(t->type))),
                        std::move(layout), value::boolean(t->requires_grad), std::move(mem),
                        value::boolean(false)}),
          true);
      std::vector<value> chunks;
      for (const auto& c : t->chunks)
        chunks.push_back(dataclass(
            md, "ChunkStorageMetadata",
            {{"offsets", detail::torch_size(c.offsets)}, {"sizes", detail::torch_size(c.sizes)}}));
      v = dataclass(md, "TensorStorageMetadata",
                    {{"properties", std::move(props)},
                     {"size", detail::torch_size(t->size)},
                     {"chunks", value::list(std::move(chunks))}});
    } else {
      v = dataclass(md, "BytesStorageMetadata", {});
    }
    sdm.emplace_back(value::string(fqn), std::move(v));
  }
  std::vector<std::pair<value, value>> pd;
  for (const auto& [fqn, path] : m.planner_data)
    pd.emplace_back(value::string(fqn), value::tuple(path));
  std::vector<std::pair<value, value>> sd;
  for (const auto& [k, info] : m.storage_data) {
    value key = dataclass(md, "MetadataIndex",
                          {{"fqn", value::string(k.fqn)},
                           {"offset", k.offset ? detail::torch_size(*k.offset) : value()},
                           {"index", k.hint ? value::integer(*k.hint) : value()}});
    value val = dataclass(fs, "_StorageInfo",
                          {{"relative_path", value::string(info.relative_path)},
                           {"offset", value::integer(static_cast<std::int64_t>(info.offset))},
                           {"length", value::integer(static_cast<std::int64_t>(info.length))}});
    sd.emplace_back(std::move(key), std::move(val));
  }
  std::vector<std::pair<std::string, value>> fields{
      {"state_dict_metadata", value::dict(std::move(sdm))},
      {"planner_data", value::dict(std::move(pd))},
      {"storage_data", value::dict(std::move(sd))}};
  if (f == flavor::torch2) fields.emplace_back("storage_meta", value());
  if (m.version) fields.emplace_back("version", value::string(*m.version));
  return dataclass(md, "Metadata", std::move(fields));
}

/// `.metadata` bytes for `m` (pickle protocol 4, like `pickle.dump`). Validates `m` first.
inline result<std::string> encode(const metadata& m, flavor f = flavor::torch2) {
  CAIRN_TRY(validate(m));
  return pickle::dumps(to_value(m, f), 4);
}

namespace detail {
/// A `torch.Size((ints...))` or a plain tuple/list of ints as a shape (extents unchecked).
inline std::optional<shape> as_shape(const value& v) {
  const value* p = &v;
  if (p->is_object() && p->obj->name == "Size" && !p->obj->args.elements().empty())
    p = &p->obj->args.elements()[0];
  if (!p->is_sequence()) return std::nullopt;
  shape s;
  for (const auto& x : p->elements()) {
    if (!x.is_int()) return std::nullopt;
    s.push_back(x.i);
  }
  return s;
}
inline std::string shape_str(const shape& s) {
  std::string out = "(";
  for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
  return out + ")";
}
inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace detail

namespace detail {

/// An errc::corrupt error "dcp metadata: <msg>" naming `file` and `key`.
inline error bad_metadata(const std::string& msg,
                          std::string_view file,
                          std::string_view key = {}) {
  return format_detail::corrupt("dcp metadata: " + msg, file, key);
}

/// Sets `t.type` and `t.requires_grad` from TensorProperties `props` of tensor `fqn`: a 5-tuple
/// state (dtype, layout, requires_grad, mem format, pin_memory) or, in other versions, a dict
/// with "dtype".
inline result<void> parse_tensor_properties(const value& props,
                                            const std::string& fqn,
                                            std::string_view file,
                                            tensor_meta& t) {
  const value* dt = nullptr;
  if (props.is_object()) {
    const value& st = props.obj->state;
    if (st.type == value::kind::tuple && !st.elements().empty()) {
      dt = &st.elements()[0];
      if (st.elements().size() > 2 && st.elements()[2].is_int())
        t.requires_grad = st.elements()[2].i != 0;
    } else {
      dt = props.obj->attr("dtype");
    }
  }
  if (!dt || dt->type != value::kind::global)
    return bad_metadata("tensor properties carry no torch dtype", file, fqn);
  auto type = torch_zip::dtype_from_torch_name(dt->name);
  if (!type)
    return format_detail::fail(errc::corrupt, "dcp metadata: unsupported dtype torch." + dt->name,
                               file, fqn);
  t.type = *type;
  return ok();
}

/// Sets `t.size` from `size` (a torch.Size) of tensor `fqn`, whose `t.type` is set: no negative
/// extent and at most 2^62 bytes.
inline result<void> parse_tensor_size(const value& size,
                                      const std::string& fqn,
                                      std::string_view file,
                                      tensor_meta& t) {
  auto sz = as_shape(size);
  if (!sz) return bad_metadata("size is not a torch.Size", file, fqn);
  t.size = *sz;
  if (!format_detail::file_numel(t.size, dtype_size(t.type)))
    return bad_metadata(
        "size " + shape_str(t.size) + " has a negative extent or more than 2^62 bytes", file, fqn);
  return ok();
}

/// One ChunkStorageMetadata `c` of tensor `fqn` of size `size`: offsets and sizes of the
/// tensor's rank, lying inside it.
inline result<chunk> parse_chunk(const value& c,
                                 const shape& size,
                                 const std::string& fqn,
                                 std::string_view file) {
  if (!c.is_object()) return bad_metadata("chunk is a " + c.describe(), file, fqn);
  const value* off = c.obj->attr("offsets");
  const value* szs = c.obj->attr("sizes");
  auto a = off ? as_shape(*off) : std::nullopt;
  auto b = szs ? as_shape(*szs) : std::nullopt;
  if (!a || !b || a->size() != b->size()) return bad_metadata("malformed chunk", file, fqn);
  // Inside the tensor (so its volume cannot overflow either), compared without overflow.
  if (a->size() != size.size())
    return bad_metadata("chunk of rank " + std::to_string(a->size()) + " in a tensor of rank " +
                            std::to_string(size.size()),
                        file, fqn);
  for (std::size_t ax = 0; ax < a->size(); ++ax)
    if ((*a)[ax] < 0 || (*b)[ax] < 0 || (*a)[ax] > size[ax] || (*b)[ax] > size[ax] - (*a)[ax])
      return bad_metadata("chunk offsets " + shape_str(*a) + " sizes " + shape_str(*b) +
                              " lie outside the tensor of size " + shape_str(size),
                          file, fqn);
  return chunk{std::move(*a), std::move(*b)};
}

/// A TensorStorageMetadata entry `v` of `fqn`: its properties (dtype), size and chunks.
inline result<tensor_meta> parse_tensor_meta(const value& v,
                                             const std::string& fqn,
                                             std::string_view file) {
  tensor_meta t;
  const value* props = v.obj->attr("properties");
  const value* size = v.obj->attr("size");
  const value* chunks = v.obj->attr("chunks");
  if (!props || !size || !chunks)
    return bad_metadata("tensor entry lacks properties/size/chunks", file, fqn);
  CAIRN_TRY(parse_tensor_properties(*props, fqn, file, t));
  CAIRN_TRY(parse_tensor_size(*size, fqn, file, t));
  if (!chunks->is_sequence()) return bad_metadata("chunks is a " + chunks->describe(), file, fqn);
  for (const auto& c : chunks->elements()) {
    CAIRN_TRY_ASSIGN(chunk ch, parse_chunk(c, t.size, fqn, file));
    t.chunks.push_back(std::move(ch));
  }
  return t;
}

/// Fills `m.state_dict_metadata` from the `state_dict_metadata` dict `sdm`: fqn -> tensor or
/// bytes entry.
inline result<void> parse_state_dict_metadata(const value& sdm,
                                              std::string_view file,
                                              metadata& m) {
  for (const auto& [k, v] : *sdm.entries) {
    if (!k.is_string()) return bad_metadata("state_dict_metadata key is a " + k.describe(), file);
    const std::string& fqn = k.str;
    if (!v.is_object()) return bad_metadata("entry is a " + v.describe(), file, fqn);
    if (ends_with(v.obj->name, "BytesStorageMetadata")) {
      m.state_dict_metadata.emplace(fqn, bytes_meta{});
      continue;
    }
    CAIRN_TRY_ASSIGN(tensor_meta t, parse_tensor_meta(v, fqn, file));
    m.state_dict_metadata.emplace(fqn, std::move(t));
  }
  return ok();
}

/// One `storage_data` entry: MetadataIndex `k` (fqn, offset, index) and _StorageInfo `v`
/// (relative_path, and offset and length in [0, 2^63)).
inline result<std::pair<index, storage_info>> parse_storage_item(const value& k,
                                                                 const value& v,
                                                                 std::string_view file) {
  if (!k.is_object() || !v.is_object())
    return bad_metadata("storage_data entry is not objects", file);
  index ix;
  const value* fqn = k.obj->attr("fqn");
  if (!fqn || !fqn->is_string()) return bad_metadata("MetadataIndex without fqn", file);
  ix.fqn = fqn->str;
  if (const value* off = k.obj->attr("offset"); off && !off->is_none()) {
    ix.offset = as_shape(*off);
    if (!ix.offset) return bad_metadata("MetadataIndex offset is not a torch.Size", file, ix.fqn);
  }
  if (const value* h = k.obj->attr("index"); h && h->is_int()) ix.hint = h->i;
  storage_info info;
  const value* rp = v.obj->attr("relative_path");
  const value* so = v.obj->attr("offset");
  const value* len = v.obj->attr("length");
  if (!rp || !rp->is_string() || !so || !so->is_int() || !len || !len->is_int() || so->i < 0 ||
      len->i < 0)
    return bad_metadata("malformed _StorageInfo", file, ix.fqn);
  // Both are below 2^63, so offset + length cannot overflow 64 bits.
  info.relative_path = rp->str;
  info.offset = static_cast<std::uint64_t>(so->i);
  info.length = static_cast<std::uint64_t>(len->i);
  return std::make_pair(std::move(ix), std::move(info));
}

/// Keeps the Metadata fields of `o` that cairn does not interpret in `m.extras`.
inline void collect_extras(const pickle::object& o, metadata& m) {
  if (o.state.is_dict())
    for (const auto& [k, v] : *o.state.entries)
      if (k.is_string() && k.str != "state_dict_metadata" && k.str != "planner_data" &&
          k.str != "storage_data" && k.str != "version")
        m.extras.emplace(k.str, v);
}

}  // namespace detail

/// Interprets an unpickled `.metadata` tree. Classes are recognized by name whatever their module
/// (torch 1.13 `_shard` paths, 2.x paths, subclasses like Megatron's `MCoreMetadata`); fields
/// cairn does not use are kept in `extras`. `file` names the source in errors.
inline result<metadata> from_value(const pickle::value& root, std::string_view file = {}) {
  using pickle::value;
  if (!root.is_object())
    return detail::bad_metadata("top level is a " + root.describe() + ", not Metadata", file);
  metadata m;
  m.class_module = root.obj->module;
  m.class_name = root.obj->name;
  const pickle::object& o = *root.obj;
  const value* sdm = o.attr("state_dict_metadata");
  if (!sdm || !sdm->is_dict()) return detail::bad_metadata("no state_dict_metadata dict", file);
  CAIRN_TRY(detail::parse_state_dict_metadata(*sdm, file, m));
  if (const value* pd = o.attr("planner_data"); pd && pd->is_dict())
    for (const auto& [k, v] : *pd->entries)
      if (k.is_string()) m.planner_data[k.str] = v.elements();
  if (const value* sd = o.attr("storage_data"); sd && sd->is_dict()) {
    for (const auto& [k, v] : *sd->entries) {
      CAIRN_TRY_ASSIGN(auto item, detail::parse_storage_item(k, v, file));
      m.storage_data.push_back(std::move(item));
    }
  }
  if (const value* v = o.attr("version"); v && v->is_string()) m.version = v->str;
  detail::collect_extras(o, m);
  return m;
}

/// Parses `.metadata` bytes.
inline result<metadata> decode(std::span<const std::byte> bytes, std::string_view file = {}) {
  CAIRN_TRY_ASSIGN(pickle::value root, pickle::load(bytes, file));
  return from_value(root, file);
}

/// Checks that the data `m` claims is there, before anything is sized by it: every item's
/// byte range lies inside its file on `st` (one `size` per file), items of one file do not
/// overlap, every tensor chunk has an item at least as large as the chunk's bytes, and a
/// tensor's chunks hold at least as many elements as the tensor. So the bytes of all tensors
/// are at most the bytes of the files. `errc::corrupt` naming the key, file and offset.
inline result<void> check_storage(storage_ref st, const metadata& m) {
  std::map<std::pair<std::string, shape>, const storage_info*> where;
  std::map<std::string, std::vector<std::pair<const storage_info*, const index*>>> by_file;
  for (const auto& [ix, info] : m.storage_data) {
    if (ix.offset) where.emplace(std::make_pair(ix.fqn, *ix.offset), &info);
    by_file[info.relative_path].emplace_back(&info, &ix);
  }
  for (auto& [name, items] : by_file) {
    CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(name));
    std::string file = st.describe(name);
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first->offset < b.first->offset; });
    std::uint64_t end = 0;
    for (const auto& [info, ix] : items) {
      if (info->offset > size || info->length > size - info->offset)
        return format_detail::corrupt("dcp: item bytes [" + std::to_string(info->offset) + ", +" +
                                          std::to_string(info->length) +
                                          ") lie past the end of the file (" +
                                          std::to_string(size) + " bytes)",
                                      file, ix->fqn, std::min(info->offset, size));
      if (info->offset < end && info->length > 0)
        return format_detail::corrupt("dcp: item overlaps the previous item of its file", file,
                                      ix->fqn, info->offset);
      end = std::max(end, info->offset + info->length);
    }
  }
  for (const auto& [fqn, item] : m.state_dict_metadata) {
    const auto* t = std::get_if<tensor_meta>(&item);
    if (!t) continue;
    const std::uint64_t es = dtype_size(t->type);
    std::uint64_t covered = 0;  // at most 2^62 per chunk (checked by the reader): no overflow
    for (const auto& c : t->chunks) {
      auto w = where.find(std::make_pair(fqn, c.offsets));
      auto n = format_detail::file_numel(c.sizes, es);
      if (w == where.end() || !n)
        return std::move(
                   make_error(errc::corrupt,
                              "dcp: chunk at offsets " + detail::shape_str(c.offsets) +
                                  (n ? " has no storage_data entry" : " has an invalid size")))
            .with_key(fqn)
            .with_file(st.describe(metadata_name));
      if (static_cast<std::uint64_t>(*n) * es > w->second->length)
        return format_detail::corrupt(
            "dcp: chunk of " + std::to_string(static_cast<std::uint64_t>(*n) * es) +
                " bytes stored in an item of " + std::to_string(w->second->length),
            st.describe(w->second->relative_path), fqn, w->second->offset);
      covered =
          std::min<std::uint64_t>(covered + static_cast<std::uint64_t>(*n), std::uint64_t{1} << 63);
    }
    auto need = format_detail::file_numel(t->size, es);
    if (!need || covered < static_cast<std::uint64_t>(*need))
      return make_error(errc::corrupt, "dcp: chunks hold " + std::to_string(covered) +
                                           " of the tensor's " + std::to_string(need ? *need : -1) +
                                           " elements")
          .with_key(fqn)
          .with_file(st.describe(metadata_name));
  }
  return ok();
}

/// Reads and parses the `.metadata` object of a checkpoint on `st` (`name` defaults to it).
inline result<metadata> read(storage_ref st, std::string_view name = metadata_name) {
  CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(name));
  CAIRN_TRY_ASSIGN(auto bytes, format_detail::read_bytes(st, name, 0, size));
  return decode(bytes, st.describe(name));
}

/// Writes `.metadata` with `put` (atomic: readers never see a partial file).
inline result<void> write(storage_ref st,
                          const metadata& m,
                          flavor f = flavor::torch2,
                          std::string_view name = metadata_name) {
  CAIRN_TRY_ASSIGN(std::string bytes, encode(m, f));
  return st.put(name, format_detail::as_bytes(bytes));
}

}  // namespace cairn::dcp
