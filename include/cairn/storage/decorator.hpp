// cairn/storage/decorator.hpp: the base of storage decorators. It holds the wrapped backend
// and forwards every member to it, so a decorator (throttled, cached, writer slots) redefines
// only the members it changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Forwards every storage member to the backend it wraps (which must outlive it). Derive a
/// decorator from it and redefine what the decorator changes; the rest passes through.
template <storage S>
class storage_decorator {
 public:
  /// Wraps `inner`.
  explicit storage_decorator(S& inner) noexcept : inner_(&inner) {}

  /// The wrapped backend.
  S& inner() const noexcept { return *inner_; }
  /// What the wrapped backend guarantees.
  storage_features features() const { return storage_features_of(*inner_); }

  /// Forwarded.
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    return inner_->put(name, data);
  }
  /// Forwarded.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    return inner_->open_writer(name);
  }
  /// Forwarded.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    return inner_->read(name, offset, out);
  }
  /// Forwarded.
  result<std::uint64_t> size(std::string_view name) { return inner_->size(name); }
  /// Forwarded.
  result<bool> exists(std::string_view name) { return inner_->exists(name); }
  /// Forwarded.
  result<std::vector<std::string>> list(std::string_view prefix) { return inner_->list(prefix); }
  /// Forwarded.
  result<void> remove(std::string_view name) { return inner_->remove(name); }
  /// Forwarded.
  std::string describe(std::string_view name) const { return inner_->describe(name); }
  /// Forwarded when the backend has it (see `storage_with_temporaries`).
  result<std::size_t> remove_temporaries(std::string_view prefix) {
    return storage_ref(*inner_).remove_temporaries(prefix);
  }

 protected:
  S* inner_;  ///< the wrapped backend
};

}  // namespace cairn
