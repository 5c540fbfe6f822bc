// cairn/format/stream/slab-inl.hpp: the bodies of cairn/format/stream/slab.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>

#include "cairn/format/stream/slab.hpp"

namespace cairn::stream {

CAIRN_INLINE std::vector<box> slabs(const shape& dims,
                                    std::size_t elem_size,
                                    std::uint64_t max_bytes) {
  const std::size_t n = dims.size();
  box whole{shape(n, 0), dims};
  if (n == 0 || numel(dims) == 0) return {whole};
  std::size_t k = 0;
  std::uint64_t inner = elem_size;
  for (std::size_t a = 1; a < n; ++a) inner *= static_cast<std::uint64_t>(dims[a]);
  while (k + 1 < n && inner > max_bytes) inner /= static_cast<std::uint64_t>(dims[++k]);
  std::int64_t step = static_cast<std::int64_t>(std::max<std::uint64_t>(1, max_bytes / inner));
  std::vector<box> out;
  shape idx(k, 0);
  for (;;) {
    for (std::int64_t j = 0; j < dims[k]; j += step) {
      box b = whole;
      for (std::size_t a = 0; a < k; ++a) {
        b.offset[a] = idx[a];
        b.size[a] = 1;
      }
      b.offset[k] = j;
      b.size[k] = std::min(step, dims[k] - j);
      out.push_back(std::move(b));
    }
    std::size_t a = k;
    while (a > 0) {
      --a;
      if (++idx[a] < dims[a]) break;
      idx[a] = 0;
      if (a == 0) return out;
    }
    if (k == 0) return out;
  }
}

CAIRN_INLINE std::span<std::byte> slab_buffers::get(int which, std::size_t n) {
  if (size_[which] < n) {
    buf_[which].reset(new std::byte[n]);
    size_[which] = n;
  }
  return {buf_[which].get(), n};
}

}  // namespace cairn::stream

namespace cairn::stream::detail {

CAIRN_INLINE std::vector<slab_job> plan_jobs(const std::vector<const tensor_entry*>& ts,
                                             const stream_settings& settings) {
  std::vector<slab_job> jobs;
  for (const tensor_entry* t : ts) {
    dtype out = output_dtype(t->type, settings.to_dtype);
    std::size_t es = std::max(dtype_size(t->type), dtype_size(out));
    for (box& b : slabs(t->global_shape, es, settings.slab_bytes)) {
      std::int64_t flat = 0;
      for (std::size_t a = 0; a < b.offset.size(); ++a)
        flat = flat * t->global_shape[a] + b.offset[a];
      if (numel(t->global_shape) == 0) flat = 0;
      jobs.push_back({t, std::move(b), static_cast<std::uint64_t>(flat) * dtype_size(out), out});
    }
  }
  return jobs;
}

}  // namespace cairn::stream::detail
