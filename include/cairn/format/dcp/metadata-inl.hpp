// cairn/format/dcp/metadata-inl.hpp: the bodies of cairn/format/dcp/metadata.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>

#include "cairn/format/dcp/metadata.hpp"

namespace cairn::dcp {

CAIRN_INLINE const storage_info* metadata::find(std::string_view fqn,
                                                const std::optional<shape>& offset) const {
  for (const auto& [k, v] : storage_data)
    if (k.fqn == fqn && k.offset == offset) return &v;
  return nullptr;
}

CAIRN_INLINE result<void> validate(const metadata& m) {
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

}  // namespace cairn::dcp

namespace cairn::dcp::detail {

CAIRN_INLINE value ints_tuple(const shape& s) {
  std::vector<value> xs;
  for (auto x : s) xs.push_back(value::integer(x));
  return value::tuple(std::move(xs));
}

CAIRN_INLINE value dataclass(std::string module,
                             std::string name,
                             std::vector<std::pair<std::string, value>> fields) {
  std::vector<std::pair<value, value>> es;
  for (auto& [k, v] : fields) es.emplace_back(value::string(k), std::move(v));
  return value::instance(std::move(module), std::move(name), value::tuple(),
                         es.empty() ? value() : value::dict(std::move(es)), true);
}

}  // namespace cairn::dcp::detail

namespace cairn::dcp {

CAIRN_INLINE pickle::value to_value(const metadata& m, flavor f) {
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

CAIRN_INLINE result<std::string> encode(const metadata& m, flavor f) {
  CAIRN_TRY(validate(m));
  return pickle::dumps(to_value(m, f), 4);
}

}  // namespace cairn::dcp

namespace cairn::dcp::detail {

CAIRN_INLINE std::optional<shape> as_shape(const value& v) {
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

CAIRN_INLINE std::string shape_str(const shape& s) {
  std::string out = "(";
  for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
  return out + ")";
}

CAIRN_INLINE bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

CAIRN_INLINE result<void> parse_tensor_properties(const value& props,
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

CAIRN_INLINE result<void> parse_tensor_size(const value& size,
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

CAIRN_INLINE result<chunk> parse_chunk(const value& c,
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

CAIRN_INLINE result<tensor_meta> parse_tensor_meta(const value& v,
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

CAIRN_INLINE result<void> parse_state_dict_metadata(const value& sdm,
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

CAIRN_INLINE result<std::pair<index, storage_info>> parse_storage_item(const value& k,
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

CAIRN_INLINE void collect_extras(const pickle::object& o, metadata& m) {
  if (o.state.is_dict())
    for (const auto& [k, v] : *o.state.entries)
      if (k.is_string() && k.str != "state_dict_metadata" && k.str != "planner_data" &&
          k.str != "storage_data" && k.str != "version")
        m.extras.emplace(k.str, v);
}

}  // namespace cairn::dcp::detail

namespace cairn::dcp {

CAIRN_INLINE result<metadata> from_value(const pickle::value& root, std::string_view file) {
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

CAIRN_INLINE result<metadata> decode(std::span<const std::byte> bytes, std::string_view file) {
  CAIRN_TRY_ASSIGN(pickle::value root, pickle::load(bytes, file));
  return from_value(root, file);
}

CAIRN_INLINE result<void> check_storage(storage_ref st, const metadata& m) {
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

CAIRN_INLINE result<metadata> read(storage_ref st, std::string_view name) {
  CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(name));
  CAIRN_TRY_ASSIGN(auto bytes, format_detail::read_bytes(st, name, 0, size));
  return decode(bytes, st.describe(name));
}

CAIRN_INLINE result<void> write(storage_ref st,
                                const metadata& m,
                                flavor f,
                                std::string_view name) {
  CAIRN_TRY_ASSIGN(std::string bytes, encode(m, f));
  return st.put(name, format_detail::as_bytes(bytes));
}

}  // namespace cairn::dcp
