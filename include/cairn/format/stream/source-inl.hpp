// cairn/format/stream/source-inl.hpp: the bodies of cairn/format/stream/source.hpp (included by
// it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>

#include "cairn/format/native/box_reader.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/stream/source.hpp"

namespace cairn::stream {

CAIRN_INLINE const tensor_entry* source::find(std::string_view key) const noexcept {
  const auto& ts = tensors();
  auto it = std::lower_bound(ts.begin(), ts.end(), key,
                             [](const tensor_entry& e, std::string_view k) { return e.key < k; });
  return it != ts.end() && it->key == key ? &*it : nullptr;
}

CAIRN_INLINE result<void> source::read_rows(const std::string& key,
                                            std::int64_t begin,
                                            std::int64_t end,
                                            std::span<std::byte> out) {
  const tensor_entry* t = find(key);
  if (!t) return make_error(errc::not_found, "no such tensor").with_key(key);
  if (t->global_shape.empty())
    return make_error(errc::invalid_argument, "a rank-0 tensor has no rows").with_key(key);
  box b{shape(t->global_shape.size(), 0), t->global_shape};
  b.offset[0] = begin;
  b.size[0] = end - begin;
  return read_box(key, b, out);
}

}  // namespace cairn::stream

namespace cairn::stream::detail {

CAIRN_INLINE result<void> check_request(const tensor_entry* t, const box_read& r) {
  if (!t) return make_error(errc::not_found, "no such tensor").with_key(r.key);
  return check_box_read(t->global_shape, r.region, dtype_size(t->type), r.out.size(), r.key);
}

CAIRN_INLINE result<std::map<std::string, object_entry>> read_objects(
    storage_ref st, const checkpoint_metadata& m) {
  std::map<std::string, object_entry> out;
  for (const auto& [u, rec] : m.objects) {
    CAIRN_TRY_ASSIGN(auto b, read_extent(st, m, rec.where, rec.key, "object " + u));
    out.emplace(u, object_entry{rec.key, rec.global_shape, rec.global_offset, std::move(b)});
  }
  return out;
}

}  // namespace cairn::stream::detail

namespace cairn::stream {

CAIRN_INLINE result<std::unique_ptr<catalog_source>> catalog_source::open(storage_ref st,
                                                                          int io_threads) {
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_any_metadata(st));
  return over(st, std::move(m), io_threads);
}

CAIRN_INLINE result<std::unique_ptr<catalog_source>> catalog_source::over(storage_ref st,
                                                                          checkpoint_metadata m,
                                                                          int io_threads) {
  std::unique_ptr<catalog_source> s(new catalog_source(st, io_threads));
  for (const auto& [k, t] : m.tensors) s->tensors_.push_back({k, t.type, t.global_shape});
  for (const auto& [u, o] : m.objects) s->objects_.push_back(u);
  s->m_ = std::move(m);
  return s;
}

CAIRN_INLINE result<std::map<std::string, common_value>> catalog_source::commons() {
  return read_commons(st_, m_);
}

CAIRN_INLINE result<void> catalog_source::read(const std::vector<box_read>& reqs) {
  std::vector<box_request> boxes;
  for (const auto& r : reqs) {
    const tensor_entry* t = find(r.key);
    CAIRN_TRY(detail::check_request(t, r));
    if (r.region.volume() == 0) continue;
    boxes.push_back(box_request{r.key, r.region, r.out});
  }
  if (boxes.empty()) return ok();
  CAIRN_TRY_ASSIGN(read_counts counts, read_boxes(st_, m_, boxes, io_threads_, &pool_));
  (void)counts;
  return ok();
}

}  // namespace cairn::stream
