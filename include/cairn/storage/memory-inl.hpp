// cairn/storage/memory-inl.hpp: the bodies of cairn/storage/memory.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "cairn/storage/memory.hpp"
#include "cairn/storage/names.hpp"

namespace cairn::detail {

CAIRN_INLINE auto memory_objects::find(std::string_view name) -> std::shared_ptr<const bytes> {
  std::lock_guard lock(mu);
  auto it = objects.find(name);
  return it == objects.end() ? nullptr : it->second;
}

CAIRN_INLINE void memory_objects::publish(std::string_view name, std::shared_ptr<const bytes> b) {
  std::lock_guard lock(mu);
  auto it = objects.find(name);
  if (it == objects.end()) {
    objects.emplace(std::string(name), std::move(b));
  } else {
    it->second = std::move(b);
  }
}

CAIRN_INLINE result<void> memory_writer::write_at(std::uint64_t offset,
                                                  std::span<const std::byte> data) {
  // No vector grows beyond PTRDIFF_MAX bytes: a larger end would throw from resize.
  constexpr std::uint64_t max_end = static_cast<std::uint64_t>(PTRDIFF_MAX);
  if (data.size() > max_end || offset > max_end - data.size()) {
    error e = make_error(errc::invalid_argument, "write range overflows memory");
    e.file = "mem://" + name_;
    e.offset = offset;
    return e;
  }
  const std::size_t end = static_cast<std::size_t>(offset) + data.size();
  {
    // Writers of ranges inside the buffer copy in parallel under the shared lock; a write that
    // grows the buffer takes it exclusively (growing may move the bytes).
    std::shared_lock lock(mu_);
    if (finished_) return after_finish();
    if (end <= buf_.size()) {
      if (!data.empty()) std::memcpy(buf_.data() + offset, data.data(), data.size());
      return ok();
    }
  }
  std::unique_lock lock(mu_);
  if (finished_) return after_finish();
  if (end > buf_.size()) buf_.resize(end);
  if (!data.empty()) std::memcpy(buf_.data() + offset, data.data(), data.size());
  return ok();
}

CAIRN_INLINE result<void> memory_writer::finish() {
  std::unique_lock lock(mu_);
  if (finished_) {
    error e = make_error(errc::invalid_argument, "finish() called twice on mem://" + name_);
    e.file = "mem://" + name_;
    return e;
  }
  finished_ = true;
  store_->publish(name_, std::make_shared<const std::vector<std::byte>>(std::move(buf_)));
  return ok();
}

CAIRN_INLINE error memory_writer::after_finish() const {
  error e = make_error(errc::invalid_argument, "write_at after finish() on mem://" + name_);
  e.file = "mem://" + name_;
  return e;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<void> memory_storage::put(std::string_view name,
                                              std::span<const std::byte> data) {
  CAIRN_TRY(check_object_name(name));
  store_->publish(name, std::make_shared<const bytes>(data.begin(), data.end()));
  return ok();
}

CAIRN_INLINE result<std::unique_ptr<object_writer>> memory_storage::open_writer(
    std::string_view name) {
  CAIRN_TRY(check_object_name(name));
  return std::unique_ptr<object_writer>(
      std::make_unique<detail::memory_writer>(store_, std::string(name)));
}

CAIRN_INLINE result<void> memory_storage::read(std::string_view name,
                                               std::uint64_t offset,
                                               std::span<std::byte> out) const {
  CAIRN_TRY(check_object_name(name));
  auto b = store_->find(name);
  if (!b) return missing(name);
  const std::uint64_t size = b->size();
  const std::uint64_t avail = offset < size ? size - offset : 0;
  if (out.size() > avail || offset > size) {
    error e = make_error(errc::corrupt, "truncated: reading " + std::to_string(out.size()) +
                                            " bytes at offset " + std::to_string(offset) + " of " +
                                            describe(name) + ", the object ends at byte " +
                                            std::to_string(size));
    e.file = describe(name);
    e.offset = offset + std::min<std::uint64_t>(avail, out.size());
    return e;
  }
  if (!out.empty()) std::memcpy(out.data(), b->data() + offset, out.size());
  return ok();
}

CAIRN_INLINE result<std::uint64_t> memory_storage::size(std::string_view name) const {
  CAIRN_TRY(check_object_name(name));
  auto b = store_->find(name);
  if (!b) return missing(name);
  return static_cast<std::uint64_t>(b->size());
}

CAIRN_INLINE result<bool> memory_storage::exists(std::string_view name) const {
  CAIRN_TRY(check_object_name(name));
  return store_->find(name) != nullptr;
}

CAIRN_INLINE result<std::vector<std::string>> memory_storage::list(std::string_view prefix) const {
  CAIRN_TRY(check_list_prefix(prefix));
  std::vector<std::string> names;
  std::lock_guard lock(store_->mu);
  for (auto it = store_->objects.lower_bound(prefix);
       it != store_->objects.end() && it->first.starts_with(prefix); ++it) {
    names.push_back(it->first);
  }
  return names;
}

CAIRN_INLINE result<void> memory_storage::remove(std::string_view name) {
  CAIRN_TRY(check_object_name(name));
  std::lock_guard lock(store_->mu);
  auto it = store_->objects.find(name);
  if (it == store_->objects.end()) return missing(name);
  store_->objects.erase(it);
  return ok();
}

CAIRN_INLINE bool memory_storage::corrupt_byte(std::string_view name, std::uint64_t offset) {
  std::lock_guard lock(store_->mu);
  auto it = store_->objects.find(name);
  if (it == store_->objects.end() || offset >= it->second->size()) return false;
  auto copy = std::make_shared<bytes>(*it->second);
  (*copy)[static_cast<std::size_t>(offset)] ^= std::byte{0xFF};
  it->second = std::move(copy);
  return true;
}

CAIRN_INLINE bool memory_storage::truncate(std::string_view name, std::uint64_t new_size) {
  std::lock_guard lock(store_->mu);
  auto it = store_->objects.find(name);
  if (it == store_->objects.end() || new_size >= it->second->size()) return false;
  auto n = static_cast<std::ptrdiff_t>(new_size);
  it->second = std::make_shared<const bytes>(it->second->begin(), it->second->begin() + n);
  return true;
}

CAIRN_INLINE std::optional<std::vector<std::byte>> memory_storage::contents(
    std::string_view name) const {
  auto b = store_->find(name);
  if (!b) return std::nullopt;
  return *b;
}

CAIRN_INLINE std::size_t memory_storage::object_count() const {
  std::lock_guard lock(store_->mu);
  return store_->objects.size();
}

CAIRN_INLINE std::uint64_t memory_storage::total_bytes() const {
  std::lock_guard lock(store_->mu);
  std::uint64_t n = 0;
  for (const auto& [name, b] : store_->objects) n += b->size();
  return n;
}

CAIRN_INLINE error memory_storage::missing(std::string_view name) const {
  error e = make_error(errc::not_found, "no object " + describe(name));
  e.file = describe(name);
  return e;
}

}  // namespace cairn
