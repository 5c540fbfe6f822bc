// cairn/format/dcp/reader-inl.hpp: the bodies of cairn/format/dcp/reader.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"

namespace cairn::detail {

CAIRN_INLINE std::optional<std::tuple<std::string, shape, shape>> parse_object_unique_key(
    const std::string& u) {
  auto at = u.rfind("/shard_");
  if (at == std::string::npos) return std::nullopt;
  std::string rest = u.substr(at + 7);
  auto us = rest.find('_');
  if (us == std::string::npos) return std::nullopt;
  auto ints = [](const std::string& s) -> std::optional<shape> {
    shape out;
    std::size_t i = 0;
    while (i <= s.size()) {
      std::size_t j = s.find('.', i);
      if (j == std::string::npos) j = s.size();
      if (j == i) return s.empty() ? std::optional<shape>(out) : std::nullopt;
      std::int64_t v = 0;
      for (std::size_t k = i; k < j; ++k) {
        if (s[k] < '0' || s[k] > '9' || v > (INT64_MAX - (s[k] - '0')) / 10) return std::nullopt;
        v = v * 10 + (s[k] - '0');
      }
      out.push_back(v);
      i = j + 1;
    }
    return out;
  };
  auto off = ints(rest.substr(0, us)), grid = ints(rest.substr(us + 1));
  if (!off || !grid || off->size() != grid->size()) return std::nullopt;
  return std::make_tuple(u.substr(0, at), *off, *grid);
}

CAIRN_INLINE std::optional<common_value> common_from_pickle(const pickle::value& v) {
  using K = pickle::value::kind;
  auto put = [](common_value& c, auto x) {
    auto b = std::as_bytes(std::span(&x, 1));
    c.data.insert(c.data.end(), b.begin(), b.end());
  };
  // Appends one Python scalar; all elements of a vector share one dtype.
  auto scalar = [&](const pickle::value& x, common_value& c) -> bool {
    auto push = [&](dtype t, auto value) {
      if (!c.data.empty() && c.type != t) return false;
      c.type = t;
      put(c, value);
      return true;
    };
    switch (x.type) {
      case K::boolean:
        return push(dtype::bool_, static_cast<std::uint8_t>(x.i != 0));
      case K::integer:
        return push(dtype::i64, x.i);
      case K::floating:
        return push(dtype::f64, x.f);
      default:
        return false;
    }
  };
  common_value c;
  if (v.type == K::string) {
    c.kind = common_kind::string;
    c.data.assign(reinterpret_cast<const std::byte*>(v.str.data()),
                  reinterpret_cast<const std::byte*>(v.str.data()) + v.str.size());
    return c;
  }
  if (v.type == K::list || v.type == K::tuple) {
    c.kind = common_kind::vector;
    c.type = dtype::i64;
    if (v.items)
      for (const auto& x : *v.items)
        if (!scalar(x, c)) return std::nullopt;
    return c;
  }
  c.kind = common_kind::scalar;
  if (!scalar(v, c)) return std::nullopt;
  return c;
}

CAIRN_INLINE result<std::uint32_t> file_index_of(storage_ref st,
                                                 checkpoint_metadata& m,
                                                 std::map<std::string, std::uint32_t>& index,
                                                 const std::string& name) {
  auto it = index.find(name);
  if (it != index.end()) return it->second;
  CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(name));
  auto i = static_cast<std::uint32_t>(m.files.size());
  m.files.push_back(file_record{name, 0, n});
  index.emplace(name, i);
  return i;
}

/// Whether a `torch.save` view is row-major contiguous (sizes of 1 may have any stride): DCP
/// items and torch_save files are read in place only then.
CAIRN_INLINE bool row_major(const torch_zip::tensor_ref& t) {
  std::int64_t expect = 1;
  for (std::size_t d = t.dims.size(); d-- > 0;) {
    if (t.dims[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.dims[d];
  }
  return true;
}

/// Where the `nbytes` bytes of the contiguous view `t` lie in the object holding storage record
/// `rec` of an archive that starts `base` bytes into it: the record's payload from the view's
/// storage offset. errc::corrupt, without key or file (the caller adds them), when the record
/// is shorter than the view.
CAIRN_INLINE result<std::uint64_t> storage_bytes_at(const torch_zip::record& rec,
                                                    std::uint64_t base,
                                                    const torch_zip::tensor_ref& t,
                                                    std::uint64_t nbytes) {
  // as_tensor checked the view: its offset and bytes are within 2^62.
  const std::uint64_t es = dtype_size(t.type);
  const auto first = static_cast<std::uint64_t>(t.storage_offset);
  if (first > rec.size / es || nbytes > rec.size - first * es)
    return make_error(errc::corrupt, "the tensor's storage record holds " +
                                         std::to_string(rec.size) + " bytes, the tensor " +
                                         std::to_string(nbytes) + " from element " +
                                         std::to_string(first));
  // base + data_offset + first * es <= the object's size < 2^63: no overflow.
  return base + rec.data_offset + first * es;
}

/// `storage_bytes_at` of the view `t` of archive `a` (a `torch.save` file): its storage record
/// found by key. errc::corrupt, without key or file, when the record is missing.
CAIRN_INLINE result<std::uint64_t> archive_bytes_at(const torch_zip::archive& a,
                                                    const torch_zip::tensor_ref& t,
                                                    std::uint64_t nbytes) {
  const torch_zip::record* rec = a.zip.find(a.prefix + "/data/" + t.storage_key);
  if (!rec) return make_error(errc::corrupt, "the tensor's storage record is missing");
  return storage_bytes_at(*rec, a.zip.base, t, nbytes);
}

}  // namespace cairn::detail

namespace cairn::dcp {

CAIRN_INLINE result<reader> reader::open(storage_ref st) {
  CAIRN_TRY_ASSIGN(metadata m, read(st));
  CAIRN_TRY(check_storage(st, m));
  reader r(st, std::move(m));
  for (std::size_t i = 0; i < r.m_.storage_data.size(); ++i) {
    const auto& idx = r.m_.storage_data[i].first;
    if (idx.offset)
      r.chunk_items_.emplace(std::make_pair(idx.fqn, *idx.offset), i);
    else
      r.bytes_items_.emplace(idx.fqn, i);
  }
  return r;
}

CAIRN_INLINE result<const storage_info*> reader::chunk_item(const std::string& key,
                                                            const chunk& c) const {
  auto it = chunk_items_.find(std::make_pair(key, c.offsets));
  if (it == chunk_items_.end())
    return make_error(errc::corrupt,
                      "dcp: no storage_data entry for chunk " + box{c.offsets, c.sizes}.str())
        .with_key(key)
        .with_file(st_.describe(metadata_name));
  return &m_.storage_data[it->second].second;
}

CAIRN_INLINE const storage_info* reader::bytes_item(const std::string& key) const {
  auto it = bytes_items_.find(key);
  return it == bytes_items_.end() ? nullptr : &m_.storage_data[it->second].second;
}

CAIRN_INLINE result<const torch_zip::archive*> reader::item(const storage_info& where) {
  auto k = std::make_pair(where.relative_path, where.offset);
  auto it = archives_.find(k);
  if (it != archives_.end()) return &it->second;
  CAIRN_TRY_ASSIGN(torch_zip::archive a,
                   torch_zip::open_archive(st_, where.relative_path, where.offset, where.length));
  if (archives_.size() >= 4096) archives_.clear();
  return &archives_.emplace(k, std::move(a)).first->second;
}

CAIRN_INLINE result<torch_zip::tensor_ref> reader::item_tensor(const storage_info& where,
                                                               const std::string& key,
                                                               dtype type,
                                                               std::int64_t volume) {
  CAIRN_TRY_ASSIGN(const torch_zip::archive* a, item(where));
  auto ref = torch_zip::as_tensor(a->root);
  if (!ref || ref->type != type || numel(ref->dims) != volume)
    return make_error(errc::corrupt, "dcp: item is not a " + std::string(dtype_name(type)) +
                                         " tensor of " + std::to_string(volume) + " elements")
        .with_key(key)
        .with_file(st_.describe(where.relative_path));
  return *ref;
}

CAIRN_INLINE result<item_span> reader::contiguous_span(const storage_info& where,
                                                       const std::string& key,
                                                       dtype type,
                                                       std::int64_t volume) {
  CAIRN_TRY_ASSIGN(torch_zip::tensor_ref ref, item_tensor(where, key, type, volume));
  if (!contiguous(ref))
    return make_error(errc::unsupported_version,
                      "dcp: item is a non-contiguous view; load cannot read it in "
                      "place (rewrite the checkpoint with `cairn convert`)")
        .with_key(key)
        .with_file(st_.describe(where.relative_path));
  return span_of(where, key, ref, type, volume);
}

CAIRN_INLINE result<void> reader::read_box(const std::string& key,
                                           const box& region,
                                           std::span<std::byte> out) {
  auto found = m_.state_dict_metadata.find(key);
  const auto* tm =
      found == m_.state_dict_metadata.end() ? nullptr : std::get_if<tensor_meta>(&found->second);
  if (!tm) return make_error(errc::not_found, "dcp: no such tensor").with_key(key);
  CAIRN_TRY(check_box_read(tm->size, region, dtype_size(tm->type), out.size(), key));
  if (region.volume() == 0) return ok();
  std::int64_t covered = 0;
  for (const auto& c : tm->chunks) {
    box cb{c.offsets, c.sizes};
    auto x = intersect(cb, region);
    if (!x && !(region.size.empty() && cb.size.empty())) continue;
    box part = x ? *x : region;
    covered += part.volume();
    CAIRN_TRY(read_chunk_part(key, *tm, c, region, part, out));
  }
  if (covered != region.volume())
    return make_error(errc::integrity, "the checkpoint's chunks cover " + std::to_string(covered) +
                                           " of the " + std::to_string(region.volume()) +
                                           " elements of " + region.str())
        .with_key(key);
  return ok();
}

CAIRN_INLINE result<item_span> reader::span_of(const storage_info& where,
                                               const std::string& key,
                                               const torch_zip::tensor_ref& ref,
                                               dtype type,
                                               std::int64_t volume) {
  CAIRN_TRY_ASSIGN(const torch_zip::record* rec, storage_record(where, key, ref));
  // item_tensor checked the view: volume * es is within 2^62.
  const std::uint64_t n = static_cast<std::uint64_t>(volume) * dtype_size(type);
  auto at = cairn::detail::storage_bytes_at(*rec, where.offset, ref, n);
  if (!at) return std::move(at).err().with_key(key).with_file(st_.describe(where.relative_path));
  return item_span{where.relative_path, *at, n};
}

CAIRN_INLINE bool reader::contiguous(const torch_zip::tensor_ref& ref) {
  return cairn::detail::row_major(ref);
}

CAIRN_INLINE result<const torch_zip::record*> reader::storage_record(
    const storage_info& where, const std::string& key, const torch_zip::tensor_ref& ref) {
  CAIRN_TRY_ASSIGN(const torch_zip::archive* a, item(where));
  const torch_zip::record* rec = a->zip.find(a->prefix + "/data/" + ref.storage_key);
  if (!rec)
    return make_error(errc::corrupt, "dcp: item has no storage record")
        .with_key(key)
        .with_file(st_.describe(where.relative_path));
  return rec;
}

CAIRN_INLINE result<void> reader::read_chunk_part(const std::string& key,
                                                  const tensor_meta& tm,
                                                  const chunk& c,
                                                  const box& region,
                                                  const box& part,
                                                  std::span<std::byte> out) {
  const box cb{c.offsets, c.sizes};
  const std::size_t es = dtype_size(tm.type);
  CAIRN_TRY_ASSIGN(const storage_info* where, chunk_item(key, c));
  CAIRN_TRY_ASSIGN(torch_zip::tensor_ref ref, item_tensor(*where, key, tm.type, cb.volume()));
  // Element span of `part` inside the chunk (row-major), read in one piece.
  std::int64_t lo = -1, hi = 0;
  for_each_run(cb, region, part, [&](std::int64_t s, std::int64_t, std::int64_t n) {
    if (lo < 0) lo = s;
    hi = s + n;
  });
  if (lo < 0) return ok();
  std::vector<std::byte> buf;
  std::int64_t base = 0;
  const std::string file = st_.describe(where->relative_path);
  if (contiguous(ref)) {
    CAIRN_TRY_ASSIGN(item_span span, span_of(*where, key, ref, tm.type, cb.volume()));
    CAIRN_TRY_ASSIGN(buf,
                     format_detail::buffer(static_cast<std::uint64_t>(hi - lo) * es, file, key));
    auto rd = st_.read(span.file, span.offset + static_cast<std::uint64_t>(lo) * es, buf);
    if (!rd) return std::move(rd).err().with_key(key).with_file(file);
    base = lo;
  } else {
    CAIRN_TRY_ASSIGN(const torch_zip::archive* a, item(*where));
    auto whole = torch_zip::read_tensor(*a, ref);
    if (!whole) return std::move(whole).err().with_key(key);
    buf = std::move(*whole);
  }
  for_each_run(cb, region, part, [&](std::int64_t s, std::int64_t t, std::int64_t n) {
    std::memcpy(out.data() + static_cast<std::size_t>(t) * es,
                buf.data() + static_cast<std::size_t>(s - base) * es,
                static_cast<std::size_t>(n) * es);
  });
  return ok();
}

}  // namespace cairn::dcp

namespace cairn {

namespace detail {

CAIRN_INLINE std::map<std::string, std::string> content_metadata_from_pickle(
    const pickle::value& dict) {
  std::map<std::string, std::string> out;
  if (!dict.entries) return out;
  for (const auto& [k, v] : *dict.entries) {
    if (k.type != pickle::value::kind::string) continue;
    switch (v.type) {
      case pickle::value::kind::string:
        out[k.str] = v.str;
        break;
      case pickle::value::kind::boolean:
        out[k.str] = v.i ? "True" : "False";
        break;
      case pickle::value::kind::integer:
        out[k.str] = std::to_string(v.i);
        break;
      case pickle::value::kind::floating: {
        std::array<char, 32> text{};
        auto [end, ec] = std::to_chars(text.data(), text.data() + text.size(), v.f);
        if (ec != std::errc()) break;
        std::string shown(text.data(), end);
        if (shown.find_first_of(".ein") == std::string::npos) shown += ".0";  // 1.0, as Python
        out[k.str] = std::move(shown);
        break;
      }
      case pickle::value::kind::none:
        out[k.str] = "None";
        break;
      default:  // containers and objects: not a string map's value
        break;
    }
  }
  return out;
}

CAIRN_INLINE result<void> add_dcp_objects_and_commons(storage_ref st,
                                                      dcp::reader& rd,
                                                      checkpoint_metadata& m,
                                                      std::map<std::string, std::uint32_t>& files) {
  for (const auto& [fqn, item] : rd.meta().state_dict_metadata) {
    if (std::holds_alternative<dcp::tensor_meta>(item)) continue;
    auto parsed = parse_object_unique_key(fqn);
    if (!parsed) continue;
    const dcp::storage_info* where = rd.bytes_item(fqn);
    if (!where) continue;
    CAIRN_TRY_ASSIGN(const torch_zip::archive* a, rd.item(*where));
    auto ref = torch_zip::as_tensor(a->root);
    if (!ref || ref->type != dtype::u8 || ref->dims.size() != 1) continue;  // not cairn's
    CAIRN_TRY_ASSIGN(dcp::item_span span, rd.contiguous_span(*where, fqn, dtype::u8, ref->dims[0]));
    CAIRN_TRY_ASSIGN(std::uint32_t fi, file_index_of(st, m, files, span.file));
    auto& [key, offset, grid] = *parsed;
    m.objects.emplace(fqn,
                      object_record{key, grid, offset, extent{fi, span.offset, span.nbytes, {}}});
  }
  return read_megatron_common(st, m);
}

CAIRN_INLINE result<void> read_megatron_common(storage_ref st, checkpoint_metadata& m) {
  CAIRN_TRY_ASSIGN(bool has_common, st.exists(megatron_common_name));
  if (!has_common) return ok();
  CAIRN_TRY_ASSIGN(torch_zip::archive a, torch_zip::open_archive(st, megatron_common_name));
  if (a.root.type == pickle::value::kind::dict && a.root.entries)
    for (const auto& [k, v] : *a.root.entries) {
      if (k.type != pickle::value::kind::string) continue;
      if (k.str == dcp::megatron_content_metadata_key && v.is_dict()) {
        m.content_metadata = content_metadata_from_pickle(v);
        continue;
      }
      if (auto c = common_from_pickle(v)) m.inline_commons.emplace(k.str, *c);
    }
  return ok();
}

}  // namespace detail

CAIRN_INLINE result<std::map<std::string, std::string>> dcp_content_metadata(storage_ref st) {
  checkpoint_metadata m;
  CAIRN_TRY(detail::read_megatron_common(st, m));
  return std::move(m.content_metadata);
}

CAIRN_INLINE result<checkpoint_metadata> dcp_as_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(dcp::reader rd, dcp::reader::open(st));
  checkpoint_metadata m;
  m.format = "torch_dist";
  m.block_size = foreign_read_block;
  m.save_id = "dcp";
  std::map<std::string, std::uint32_t> files;
  for (const auto& [fqn, item] : rd.meta().state_dict_metadata) {
    const auto* t = std::get_if<dcp::tensor_meta>(&item);
    if (!t) continue;
    tensor_record rec;
    rec.type = t->type;
    rec.global_shape = t->size;
    for (const auto& c : t->chunks) {
      box b{c.offsets, c.sizes};
      CAIRN_TRY_ASSIGN(const dcp::storage_info* where, rd.chunk_item(fqn, c));
      CAIRN_TRY_ASSIGN(dcp::item_span span, rd.contiguous_span(*where, fqn, t->type, b.volume()));
      CAIRN_TRY_ASSIGN(std::uint32_t fi, detail::file_index_of(st, m, files, span.file));
      rec.chunks.push_back(chunk_record{b, extent{fi, span.offset, span.nbytes, {}}, {}});
    }
    m.tensors.emplace(fqn, std::move(rec));
  }
  CAIRN_TRY(detail::add_dcp_objects_and_commons(st, rd, m, files));
  m.world_size = 1;  // at least one rank saved it, even with no tensor files
  for (const auto& f : m.files) m.world_size = std::max(m.world_size, f.rank + 1);
  return m;
}

}  // namespace cairn
