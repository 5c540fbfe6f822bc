// cairn/storage/prefixed.hpp: prefixed_storage, the objects of a backend whose names start with
// a prefix ("step00000100/"), seen as a storage of their own. The checkpoint manager keeps
// every checkpoint of a root under its own prefix this way, on any backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// The objects of `inner` under `prefix` (a directory of file storage, a key prefix of S3):
/// name `n` here is `prefix + n` there, and `list` returns names without the prefix. The
/// backend must outlive it; what the backend promises (`features`) holds here too.
class prefixed_storage {
 public:
  /// The objects of `inner` whose names start with `prefix`, which must be empty or a valid
  /// name followed by '/' ("run1/step10/"); errc::invalid_argument otherwise.
  static result<prefixed_storage> make(storage_ref inner, std::string prefix);

  /// The prefix, ending in '/' (or empty).
  const std::string& prefix() const noexcept { return prefix_; }
  /// What the backend guarantees.
  storage_features features() const { return inner_.features(); }

  /// `put` of `prefix + name`.
  result<void> put(std::string_view name, std::span<const std::byte> data) {
    return inner_.put(full(name), data);
  }
  /// `open_writer` of `prefix + name`.
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    return inner_.open_writer(full(name));
  }
  /// `read` of `prefix + name`.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    return inner_.read(full(name), offset, out);
  }
  /// `size` of `prefix + name`.
  result<std::uint64_t> size(std::string_view name) { return inner_.size(full(name)); }
  /// `exists` of `prefix + name`.
  result<bool> exists(std::string_view name) { return inner_.exists(full(name)); }
  /// The names under `prefix + p`, without `prefix`.
  result<std::vector<std::string>> list(std::string_view p);
  /// `remove` of `prefix + name`.
  result<void> remove(std::string_view name) { return inner_.remove(full(name)); }
  /// The backend's description of `prefix + name`.
  std::string describe(std::string_view name) const { return inner_.describe(full(name)); }
  /// The backend's `remove_temporaries` under `prefix + p`.
  result<std::size_t> remove_temporaries(std::string_view p) {
    return inner_.remove_temporaries(full(p));
  }

 private:
  prefixed_storage(storage_ref inner, std::string prefix)
      : inner_(inner), prefix_(std::move(prefix)) {}
  std::string full(std::string_view name) const { return prefix_ + std::string(name); }

  storage_ref inner_;
  std::string prefix_;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/prefixed-inl.hpp"
#endif
