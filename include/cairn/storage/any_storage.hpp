// cairn/storage/any_storage.hpp: any_storage, an owning, type-erased storage: what
// open_storage(uri) returns, and a way to hold a backend chosen at run time.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// An owning handle to any `storage`: it keeps the backend alive and forwards every call to it.
/// Copies share the backend (a `std::shared_ptr` inside), so it may be passed by value and kept
/// by several owners. It models `storage` itself, so it converts to `storage_ref` and can be
/// wrapped by decorators; `features()` reports the backend's.
///
/// ```
/// cairn::any_storage st = cairn::open_storage(argv[1]).value();   // a path, file://, s3://...
/// cairn::save(state, st, comm);
/// cairn::any_storage mem{cairn::memory_storage{}};                 // owns a moved-in backend
/// ```
class any_storage {
 public:
  /// Takes ownership of `backend` (moved or copied in).
  template <storage S>
  requires(!std::same_as<std::remove_cvref_t<S>, any_storage> &&
           !std::same_as<std::remove_cvref_t<S>, storage_ref>) explicit any_storage(S&& backend)
      : any_storage(std::make_shared<std::remove_cvref_t<S>>(std::forward<S>(backend))) {}

  /// Shares ownership of `backend` (not null).
  template <storage S>
  explicit any_storage(std::shared_ptr<S> backend) : ref_(*backend), owner_(std::move(backend)) {}

  /// Takes ownership of `backend` (not null).
  template <storage S>
  explicit any_storage(std::unique_ptr<S> backend)
      : any_storage(std::shared_ptr<S>(std::move(backend))) {}

  result<void> put(std::string_view name, std::span<const std::byte> data) {
    return ref_.put(name, data);
  }
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    return ref_.open_writer(name);
  }
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    return ref_.read(name, offset, out);
  }
  result<std::uint64_t> size(std::string_view name) { return ref_.size(name); }
  result<bool> exists(std::string_view name) { return ref_.exists(name); }
  result<std::vector<std::string>> list(std::string_view prefix) { return ref_.list(prefix); }
  result<void> remove(std::string_view name) { return ref_.remove(name); }
  std::string describe(std::string_view name) const { return ref_.describe(name); }
  /// The backend's `remove_temporaries`, or 0 without one (see `storage_with_temporaries`).
  result<std::size_t> remove_temporaries(std::string_view prefix) {
    return ref_.remove_temporaries(prefix);
  }
  /// What the backend guarantees (see `storage_features`).
  storage_features features() const { return ref_.features(); }

  /// A non-owning reference to the backend itself (one indirection less than referencing this
  /// handle); valid while some owner keeps the backend alive.
  storage_ref ref() const noexcept { return ref_; }

 private:
  storage_ref ref_;
  std::shared_ptr<void> owner_;
};

static_assert(storage<any_storage>);
static_assert(storage_with_temporaries<any_storage>);

}  // namespace cairn
