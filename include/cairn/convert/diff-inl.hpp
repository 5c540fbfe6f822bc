// cairn/convert/diff-inl.hpp: the bodies of cairn/convert/diff.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "cairn/convert/diff.hpp"

namespace cairn::convert::detail {

CAIRN_INLINE std::optional<double> element_as_double(dtype t, const std::byte* p) {
  auto get = [&]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  };
  switch (t) {
    case dtype::bool_:
    case dtype::u8:
      return get(std::uint8_t{});
    case dtype::i8:
      return get(std::int8_t{});
    case dtype::i16:
      return get(std::int16_t{});
    case dtype::u16:
      return get(std::uint16_t{});
    case dtype::i32:
      return get(std::int32_t{});
    case dtype::u32:
      return get(std::uint32_t{});
    case dtype::i64:
      return get(std::int64_t{});
    case dtype::u64:
      return get(std::uint64_t{});
    case dtype::f32:
      return get(float{});
    case dtype::f64:
      return get(double{});
    case dtype::f16:
    case dtype::bf16: {
      double d;
      convert_elements(t, dtype::f64, std::span(p, 2), std::as_writable_bytes(std::span(&d, 1)));
      return d;
    }
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace cairn::convert::detail

namespace cairn::convert {

CAIRN_INLINE result<diff_result> diff(source& a,
                                      source& b,
                                      std::uint64_t slab_bytes,
                                      const progress_callback& progress) {
  diff_result out;
  std::map<std::string, const tensor_entry*> in_a, in_b;
  for (const auto& t : a.tensors()) in_a[t.key] = &t;
  for (const auto& t : b.tensors()) in_b[t.key] = &t;
  std::uint64_t total = 0;  // the bytes of the tensors compared element by element
  for (const auto& [key, ta] : in_a) {
    auto it = in_b.find(key);
    if (it != in_b.end() && it->second->type == ta->type &&
        it->second->global_shape == ta->global_shape)
      total += ta->nbytes();
  }
  cairn::detail::progress_meter meter(&progress, "diff", total);
  std::vector<std::byte> buf_a, buf_b;
  for (const auto& [key, ta] : in_a) {
    auto it = in_b.find(key);
    tensor_diff d;
    d.key = key;
    d.type_a = ta->type;
    d.shape_a = ta->global_shape;
    if (it == in_b.end()) {
      d.what = tensor_diff::change::removed;
      out.tensors.push_back(std::move(d));
      continue;
    }
    const tensor_entry* tb = it->second;
    d.type_b = tb->type;
    d.shape_b = tb->global_shape;
    if (ta->type != tb->type) {
      d.what = tensor_diff::change::dtype;
      out.tensors.push_back(std::move(d));
      continue;
    }
    if (ta->global_shape != tb->global_shape) {
      d.what = tensor_diff::change::shape;
      out.tensors.push_back(std::move(d));
      continue;
    }
    const std::size_t es = dtype_size(ta->type);
    for (const box& s : slabs(ta->global_shape, es, std::max<std::uint64_t>(slab_bytes, es))) {
      const std::size_t n = static_cast<std::size_t>(s.volume()) * es;
      buf_a.resize(n);
      buf_b.resize(n);
      CAIRN_TRY(a.read({{key, s, buf_a}}));
      CAIRN_TRY(b.read({{key, s, buf_b}}));
      out.bytes_compared += n;
      meter.add(n);
      if (std::memcmp(buf_a.data(), buf_b.data(), n) == 0) continue;
      for (std::size_t i = 0; i < n; i += es) {
        if (std::memcmp(buf_a.data() + i, buf_b.data() + i, es) == 0) continue;
        ++d.differing;
        auto x = detail::element_as_double(ta->type, buf_a.data() + i);
        auto y = detail::element_as_double(ta->type, buf_b.data() + i);
        if (!x || !y) continue;
        if (std::isnan(*x) && std::isnan(*y)) continue;  // NaN payloads differ
        const double delta = std::isnan(*x) || std::isnan(*y) ? NAN : std::fabs(*x - *y);
        if (std::isnan(delta) || std::isnan(d.max_abs))
          d.max_abs = NAN;
        else
          d.max_abs = std::max(d.max_abs, delta);
      }
    }
    ++out.compared;
    if (d.differing > 0) out.tensors.push_back(std::move(d));
  }
  for (const auto& [key, tb] : in_b) {
    if (in_a.count(key)) continue;
    tensor_diff d;
    d.key = key;
    d.what = tensor_diff::change::added;
    d.type_b = tb->type;
    d.shape_b = tb->global_shape;
    out.tensors.push_back(std::move(d));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const tensor_diff& x, const tensor_diff& y) { return x.key < y.key; });
  // Common values and objects: compared whole, shown short.
  using change = tensor_diff::change;
  auto compare = [&](const auto& in_a, const auto& in_b, auto show, std::vector<value_diff>& to) {
    for (const auto& [k, va] : in_a) {
      auto it = in_b.find(k);
      if (it == in_b.end()) {
        to.push_back({k, change::removed, show(va), {}});
      } else {
        ++out.values_compared;
        if (!(it->second == va)) to.push_back({k, change::values, show(va), show(it->second)});
      }
    }
    for (const auto& [k, vb] : in_b)
      if (!in_a.count(k)) to.push_back({k, change::added, {}, show(vb)});
  };
  CAIRN_TRY_ASSIGN(auto commons_a, a.commons());
  CAIRN_TRY_ASSIGN(auto commons_b, b.commons());
  compare(
      commons_a, commons_b, [](const common_value& c) { return c.str(); }, out.commons);
  CAIRN_TRY_ASSIGN(auto objects_a, a.objects());
  CAIRN_TRY_ASSIGN(auto objects_b, b.objects());
  compare(
      objects_a, objects_b,
      [](const object_entry& o) { return std::to_string(o.bytes.size()) + " bytes"; }, out.objects);
  out.world_a = a.world_size();
  out.world_b = b.world_size();
  return out;
}

}  // namespace cairn::convert
