// cairn/format/dcp/reader.hpp: a PyTorch DCP (torch_dist) checkpoint described as
// `checkpoint_metadata`, so that `load` reads it as it reads its own format: each rank plans
// against the same chunk list and reads only the byte ranges its shards need.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Name of Megatron's common-state file in a torch_dist checkpoint.
inline constexpr std::string_view megatron_common_name = "common.pt";

namespace detail {

/// Splits a sharded object's unique key `key/shard_<offset>_<grid>` (Megatron's spelling, which
/// cairn shares) into key, offset and grid.
inline std::optional<std::tuple<std::string, shape, shape>> parse_object_unique_key(
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

/// A Python value from Megatron's `common.pt` as a common value: int as I64, float as F64,
/// bool as BOOL, str as a string, a list or tuple of one of those as a vector. nullopt for
/// anything else (nested dicts, None, tensors).
inline std::optional<common_value> common_from_pickle(const pickle::value& v) {
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

inline result<std::uint32_t> file_index_of(storage_ref st,
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

}  // namespace detail

/// A PyTorch Distributed Checkpoint (`.metadata` and `.distcp` files; Megatron's torch_dist
/// backend included) described as checkpoint metadata: every tensor item becomes a chunk at the
/// byte offset of its `torch.save` storage record; bytes items named like sharded objects
/// (`key/shard_<offset>_<grid>`) that hold a uint8 tensor (what cairn's torch_dist strategy
/// writes) become objects; Megatron's `common.pt` values become common values. Reads each
/// item's ZIP directory (a few small reads per item). Items stored with a storage offset are
/// supported; non-contiguous ones fail naming the key (convert those with `cairn convert`).
inline result<checkpoint_metadata> dcp_as_metadata(storage_ref st) {
  CAIRN_TRY_ASSIGN(dcp::metadata d, dcp::read(st));
  CAIRN_TRY(dcp::check_storage(st, d));
  checkpoint_metadata m;
  m.format = "torch_dist";
  m.block_size = foreign_read_block;
  m.save_id = "dcp";
  std::map<std::string, std::uint32_t> files;
  // (fqn, offsets) -> storage info, built once (dcp::metadata::find is linear).
  std::map<std::pair<std::string, shape>, const dcp::storage_info*> where;
  std::map<std::string, const dcp::storage_info*> bytes_where;
  for (const auto& [idx, info] : d.storage_data) {
    if (idx.offset)
      where[{idx.fqn, *idx.offset}] = &info;
    else
      bytes_where[idx.fqn] = &info;
  }
  auto item_tensor = [&](const dcp::storage_info& info, const std::string& key, dtype type,
                         std::int64_t volume)
      -> result<std::pair<std::uint32_t, std::uint64_t>> {  // (file, byte offset)
    CAIRN_TRY_ASSIGN(torch_zip::archive a,
                     torch_zip::open_archive(st, info.relative_path, info.offset, info.length));
    auto ref = torch_zip::as_tensor(a.root);
    std::string file = st.describe(info.relative_path);
    if (!ref || ref->type != type || numel(ref->dims) != volume)
      return make_error(errc::corrupt, "dcp: item is not a " + std::string(dtype_name(type)) +
                                           " tensor of " + std::to_string(volume) + " elements")
          .with_key(key)
          .with_file(file);
    for (std::int64_t ax = static_cast<std::int64_t>(ref->dims.size()) - 1, s = 1; ax >= 0; --ax) {
      if (ref->dims[ax] != 1 && ref->strides[ax] != s)
        return make_error(errc::unsupported_version,
                          "dcp: item is a non-contiguous view; load cannot read it in "
                          "place (rewrite the checkpoint with `cairn convert`)")
            .with_key(key)
            .with_file(file);
      s *= ref->dims[ax];
    }
    const torch_zip::record* rec = a.zip.find(a.prefix + "/data/" + ref->storage_key);
    // as_tensor checked the view: offset and volume * es are within 2^62.
    std::uint64_t es = dtype_size(type);
    auto so = static_cast<std::uint64_t>(ref->storage_offset);
    std::uint64_t n = static_cast<std::uint64_t>(volume) * es;
    if (!rec || so > rec->size / es || n > rec->size - so * es)
      return make_error(errc::corrupt,
                        "dcp: tensor storage record is missing or "
                        "shorter than the tensor")
          .with_key(key)
          .with_file(file);
    CAIRN_TRY_ASSIGN(std::uint32_t fi, detail::file_index_of(st, m, files, info.relative_path));
    // offset < 2^63 (from the pickle) and data_offset + so * es <= length < 2^63: no overflow.
    return std::make_pair(fi, info.offset + rec->data_offset + so * es);
  };
  for (const auto& [fqn, item] : d.state_dict_metadata) {
    if (const auto* t = std::get_if<dcp::tensor_meta>(&item)) {
      tensor_record rec;
      rec.type = t->type;
      rec.global_shape = t->size;
      for (const auto& c : t->chunks) {
        auto w = where.find({fqn, c.offsets});
        if (w == where.end())
          return make_error(errc::corrupt,
                            "dcp: no storage_data entry for chunk " + box{c.offsets, c.sizes}.str())
              .with_key(fqn)
              .with_file(st.describe(dcp::metadata_name));
        box b{c.offsets, c.sizes};
        CAIRN_TRY_ASSIGN(auto at, item_tensor(*w->second, fqn, t->type, b.volume()));
        rec.chunks.push_back(
            chunk_record{b,
                         extent{at.first,
                                at.second,
                                static_cast<std::uint64_t>(b.volume()) * dtype_size(t->type),
                                {}},
                         {}});
      }
      m.tensors.emplace(fqn, std::move(rec));
    } else if (auto parsed = detail::parse_object_unique_key(fqn)) {
      auto w = bytes_where.find(fqn);
      if (w == bytes_where.end()) continue;
      CAIRN_TRY_ASSIGN(torch_zip::archive a,
                       torch_zip::open_archive(st, w->second->relative_path, w->second->offset,
                                               w->second->length));
      auto ref = torch_zip::as_tensor(a.root);
      if (!ref || ref->type != dtype::u8 || ref->dims.size() != 1) continue;  // not cairn's
      CAIRN_TRY_ASSIGN(auto at, item_tensor(*w->second, fqn, dtype::u8, ref->dims[0]));
      auto& [key, offset, grid] = *parsed;
      m.objects.emplace(
          fqn,
          object_record{key, grid, offset,
                        extent{at.first, at.second, static_cast<std::uint64_t>(ref->dims[0]), {}}});
    }
  }
  CAIRN_TRY_ASSIGN(bool has_common, st.exists(megatron_common_name));
  if (has_common) {
    CAIRN_TRY_ASSIGN(torch_zip::archive a, torch_zip::open_archive(st, megatron_common_name));
    if (a.root.type == pickle::value::kind::dict && a.root.entries)
      for (const auto& [k, v] : *a.root.entries)
        if (k.type == pickle::value::kind::string)
          if (auto c = detail::common_from_pickle(v)) m.inline_commons.emplace(k.str, *c);
  }
  m.world_size = 1;  // at least one rank saved it, even with no tensor files
  for (const auto& f : m.files) m.world_size = std::max(m.world_size, f.rank + 1);
  return m;
}

}  // namespace cairn
