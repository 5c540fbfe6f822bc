// cairn/convert/diff.hpp: compares two checkpoints of any readable layout (`cairn diff A B`):
// tensors added or removed, dtype and shape changes, and, for tensors alike in both, how many
// elements differ and the largest absolute difference. Streams slab by slab, so memory stays
// bounded by the slab size whatever the checkpoints' size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"

namespace cairn::convert {

/// How one tensor differs between two checkpoints.
struct tensor_diff {
  /// What changed.
  enum class change {
    added,    ///< only in the second checkpoint
    removed,  ///< only in the first
    dtype,    ///< the dtypes differ (values not compared)
    shape,    ///< the global shapes differ (values not compared)
    values,   ///< same dtype and shape, some elements differ
  };
  std::string key;
  change what = change::values;
  dtype type_a = dtype::f32, type_b = dtype::f32;  ///< the dtypes (added: b only; removed: a)
  shape shape_a, shape_b;                          ///< the global shapes
  std::uint64_t differing = 0;  ///< elements whose values differ (bitwise for f8 and NaN payloads)
  /// The largest |a - b| over the elements (NaN when one side holds NaN where the other does
  /// not; 0 when only bit patterns differ, as for f8 or -0.0).
  double max_abs = 0;
};

/// The result of `diff`.
struct diff_result {
  std::vector<tensor_diff> tensors;  ///< the tensors that differ, by key
  std::size_t compared = 0;          ///< tensors compared element by element
  std::uint64_t bytes_compared = 0;  ///< bytes read from each checkpoint for that
  /// Whether the two hold the same tensors with the same values.
  bool same() const noexcept { return tensors.empty(); }
};

namespace detail {

/// Element `i` of `bytes` (of dtype `t`) as a double; nullopt for f8 (compared bitwise).
inline std::optional<double> element_as_double(dtype t, const std::byte* p) {
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

}  // namespace detail

/// Compares every tensor of `a` and `b` (any layouts `open_source` reads), reading both in
/// slabs of at most `slab_bytes` per side. `progress` is told the bytes compared per side
/// ("diff").
inline result<diff_result> diff(source& a,
                                source& b,
                                std::uint64_t slab_bytes = 64ull << 20,
                                const progress_callback& progress = {}) {
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
  return out;
}

}  // namespace cairn::convert
