// cairn/format/dcp/writer-inl.hpp: the bodies of cairn/format/dcp/writer.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cstring>
#include <set>
#include <variant>

#include "cairn/format/dcp/writer.hpp"
#include "cairn/plan/box.hpp"

namespace cairn::dcp {

CAIRN_INLINE result<void> check_flavor_holds(flavor f, dtype t, const std::string& key) {
  if (flavor_holds(f, t)) return ok();
  return make_error(errc::invalid_argument,
                    "torch 1.13 has no " + std::string(dtype_name(t)) +
                        " tensors: write this checkpoint with the torch2 DCP flavor, or convert "
                        "the tensor first")
      .with_key(key);
}

CAIRN_INLINE void add_tensor_chunk(metadata& m,
                                   const std::string& key,
                                   dtype type,
                                   const shape& global_shape,
                                   const box& region,
                                   storage_info where) {
  auto [it, fresh] = m.state_dict_metadata.try_emplace(key, tensor_meta{type, global_shape, {}});
  auto& chunks = std::get<tensor_meta>(it->second).chunks;
  m.storage_data.push_back(
      {{key, region.offset, static_cast<std::int64_t>(chunks.size())}, std::move(where)});
  chunks.push_back({region.offset, region.size});
}

CAIRN_INLINE void add_bytes_item(metadata& m, const std::string& key, storage_info where) {
  m.state_dict_metadata[key] = bytes_meta{};
  m.storage_data.push_back({{key, std::nullopt, 0}, std::move(where)});
}

CAIRN_INLINE pickle::value content_metadata_to_pickle(
    const std::map<std::string, std::string>& content_metadata) {
  std::vector<std::pair<pickle::value, pickle::value>> entries;
  for (const auto& [k, v] : content_metadata)
    entries.emplace_back(pickle::value::string(k), pickle::value::string(v));
  return pickle::value::dict(std::move(entries));
}

CAIRN_INLINE pickle::value common_to_pickle(const common_value& c) {
  using pickle::value;
  auto scalar = [&](const std::byte* p) -> value {
    auto get = [&](auto v) {
      std::memcpy(&v, p, sizeof v);
      return v;
    };
    switch (c.type) {
      case dtype::bool_:
        return value::boolean(get(std::uint8_t{}) != 0);
      case dtype::u8:
        return value::integer(get(std::uint8_t{}));
      case dtype::i8:
        return value::integer(get(std::int8_t{}));
      case dtype::i16:
        return value::integer(get(std::int16_t{}));
      case dtype::u16:
        return value::integer(get(std::uint16_t{}));
      case dtype::i32:
        return value::integer(get(std::int32_t{}));
      case dtype::u32:
        return value::integer(get(std::uint32_t{}));
      case dtype::i64:
        return value::integer(get(std::int64_t{}));
      case dtype::u64:
        return value::integer(static_cast<std::int64_t>(get(std::uint64_t{})));
      case dtype::f16:
        return value::floating(f16::to_float(get(std::uint16_t{})));
      case dtype::bf16: {
        bf16 b;
        b.bits = get(std::uint16_t{});
        return value::floating(static_cast<float>(b));
      }
      case dtype::f32:
        return value::floating(get(float{}));
      case dtype::f64:
        return value::floating(get(double{}));
      default:
        return value::integer(get(std::uint8_t{}));
    }
  };
  if (c.kind == common_kind::string)
    return value::string(std::string(reinterpret_cast<const char*>(c.data.data()), c.data.size()));
  std::size_t es = dtype_size(c.type);
  if (c.kind == common_kind::scalar) return c.data.size() == es ? scalar(c.data.data()) : value();
  std::vector<value> xs;
  for (std::size_t i = 0; i + es <= c.data.size(); i += es) xs.push_back(scalar(c.data.data() + i));
  return value::list(std::move(xs));
}

}  // namespace cairn::dcp

namespace cairn::dcp::detail {

CAIRN_INLINE result<void> buffer_writer::write_at(std::uint64_t offset,
                                                  std::span<const std::byte> data) {
  std::lock_guard lock(mu_);
  if (buf_.size() < offset + data.size()) buf_.resize(offset + data.size());
  std::copy(data.begin(), data.end(), buf_.begin() + static_cast<std::ptrdiff_t>(offset));
  return ok();
}

}  // namespace cairn::dcp::detail

namespace cairn::dcp {

CAIRN_INLINE result<std::vector<std::string>> remove_items(
    storage_ref st, const std::function<bool(std::string_view fqn)>& drop) {
  CAIRN_TRY_ASSIGN(metadata m, read(st));
  if (auto it = m.extras.find("mcore_data"); it != m.extras.end() && it->second.is_dict() &&
                                             it->second.entries && !it->second.entries->empty())
    return make_error(errc::unsupported_version,
                      "this .metadata records N-D flattened tensors (Megatron's mcore_data), "
                      "which rewriting it would lose; it is left as it is")
        .with_file(st.describe(metadata_name));
  std::vector<std::string> removed;
  for (auto it = m.state_dict_metadata.begin(); it != m.state_dict_metadata.end();) {
    if (!drop(it->first)) {
      ++it;
      continue;
    }
    removed.push_back(it->first);
    m.planner_data.erase(it->first);
    it = m.state_dict_metadata.erase(it);
  }
  if (removed.empty()) return removed;
  std::set<std::string> files_before, files_after;
  for (const auto& [idx, where] : m.storage_data) files_before.insert(where.relative_path);
  std::erase_if(m.storage_data,
                [&](const auto& item) { return !m.state_dict_metadata.count(item.first.fqn); });
  for (const auto& [idx, where] : m.storage_data) files_after.insert(where.relative_path);
  const flavor f = m.class_module.find("._shard.checkpoint") != std::string::npos
                       ? flavor::torch1_13
                       : flavor::torch2;
  CAIRN_TRY(write(st, m, f));
  for (const auto& name : files_before)
    if (!files_after.count(name)) (void)st.remove(name);  // unreferenced now: only space
  return removed;
}

}  // namespace cairn::dcp
