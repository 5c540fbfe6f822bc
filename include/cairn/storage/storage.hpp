// cairn/storage/storage.hpp: the storage concept every backend models, and storage_ref, the
// non-owning type-erased handle the non-template planning and format code works through.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"

namespace cairn {

/// A streaming writer for one object, returned by a backend's `open_writer`.
///
/// `write_at` may be called concurrently from several threads for disjoint ranges. Nothing is
/// visible under the object's name as durable until `finish()` returns success; `finish()`
/// makes the bytes durable (fsync for files). Destroying a writer without `finish()` abandons
/// the object (a backend may leave a partial object behind; it is never referenced by committed
/// metadata).
class object_writer {
 public:
  virtual ~object_writer() = default;
  /// Writes `data` at byte `offset` of the object. Thread-safe for disjoint ranges.
  virtual result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) = 0;
  /// Makes everything written durable and closes the object.
  virtual result<void> finish() = 0;
};

/// What a storage backend guarantees beyond the `storage` concept's minimum. A backend states
/// it as a static member, which decorators forward and `storage_ref::features()` reports:
///
/// ```
/// static constexpr cairn::storage_features features{
///     .read_after_write = true, .list_after_write = true, .atomic_put = true};
/// ```
///
/// Every field defaults to false: a backend that declares nothing promises nothing beyond the
/// concept. The conformance suite (tests/storage/conformance_cases.hpp) checks each promise a
/// backend makes and skips, visibly, the cases whose promise it does not make.
struct storage_features {
  /// A `read`, `size` or `exists` after a successful `put` or writer `finish()` sees the new
  /// object, through this handle or any other on the same location.
  bool read_after_write = false;
  /// A `list` after a successful `put`, `finish()` or `remove` shows the change.
  bool list_after_write = false;
  /// `put` replaces an object atomically: a concurrent reader sees the old object or the new
  /// one, never a mix or a prefix. A save's commit (metadata written last with `put`) is atomic
  /// only on backends that promise this.
  bool atomic_put = false;
  /// An object being written through `open_writer` stays invisible (`exists` is false, an older
  /// object of that name stays readable) until `finish()` succeeds; a dropped writer leaves
  /// nothing behind.
  bool writer_hidden_until_finish = false;
  /// Objects outlive the process, and survive a crash of the machine once `put` or `finish()`
  /// returned.
  bool durable = false;
  /// Other processes (ranks) that open the same location see the same objects: a backend for
  /// multi-process saves.
  bool shared_between_processes = false;

  friend constexpr bool operator==(const storage_features&, const storage_features&) = default;
};

/// The features of a backend: its static `features` member (see `storage_features`), else its
/// `features()` member function (decorators and type-erased handles, which report what they
/// wrap), else none.
template <class S>
constexpr storage_features storage_features_of(const S& s) noexcept {
  if constexpr (requires {
                  { S::features } -> std::convertible_to<storage_features>;
                })
    return S::features;
  else if constexpr (requires {
                       { s.features() } -> std::convertible_to<storage_features>;
                     })
    return s.features();
  else
    return (void)s, storage_features{};
}

/// A storage backend: a flat namespace of named objects (file names relative to a root, or
/// object keys under a prefix).
///
/// - `put(name, data)` writes a whole object atomically: readers see the old object or the new
///   one, never a mix. It is the commit primitive (metadata is written with it).
/// - `open_writer(name)` streams a large object with parallel positioned writes.
/// - `read(name, offset, out)` fills `out` exactly or fails naming the file and offset.
/// - `size`, `exists`, `list(prefix)` (names relative to the root, sorted), `remove`.
/// - `describe(name)` names an object for error messages (a full path or URI).
///
/// A backend also states what it guarantees beyond this (`storage_features`), and may offer
/// `remove_temporaries` (`storage_with_temporaries`).
template <class S>
concept storage = requires(S& s,
                           const S& cs,
                           std::string_view name,
                           std::span<const std::byte> data,
                           std::span<std::byte> out,
                           std::uint64_t offset) {
  { s.put(name, data) } -> std::same_as<result<void>>;
  { s.open_writer(name) } -> std::same_as<result<std::unique_ptr<object_writer>>>;
  { s.read(name, offset, out) } -> std::same_as<result<void>>;
  { s.size(name) } -> std::same_as<result<std::uint64_t>>;
  { s.exists(name) } -> std::same_as<result<bool>>;
  { s.list(name) } -> std::same_as<result<std::vector<std::string>>>;
  { s.remove(name) } -> std::same_as<result<void>>;
  { cs.describe(name) } -> std::convertible_to<std::string>;
};

/// An optional member of a storage backend: `remove_temporaries(prefix)` deletes the temporary
/// objects that `put`s which never finished (a killed process) left under `prefix`, and returns
/// how many it removed. Backends whose `put` stages through visible-to-nobody temporaries
/// (file_storage's hidden `.<name>.tmp.*` files) provide it; a save calls it after it commits,
/// when every put of that save is done. `storage_ref` reports 0 for backends without it.
template <class S>
concept storage_with_temporaries = requires(S& s, std::string_view prefix) {
  { s.remove_temporaries(prefix) } -> std::same_as<result<std::size_t>>;
};

namespace detail {
/// The errc::corrupt error of a read that runs past the end of an object: of the bytes asked
/// for at `offset` of `file`, `got` were there; the object ends at byte `object_size`.
CAIRN_INLINE error truncated_read(const std::string& file,
                                  std::uint64_t offset,
                                  std::uint64_t got,
                                  std::uint64_t object_size);
}  // namespace detail

/// A non-owning, type-erased reference to any `storage`. Cheap to copy; the referenced backend
/// must outlive it.
class storage_ref {
 public:
  template <storage S>
  requires(!std::same_as<std::remove_cvref_t<S>, storage_ref>) storage_ref(S& s)
  noexcept  // NOLINT(implicit): any backend converts
      : self_(&s), vt_(&vtable_for<S>) {}

  result<void> put(std::string_view name, std::span<const std::byte> data) const {
    return vt_->put(self_, name, data);
  }
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) const {
    return vt_->open_writer(self_, name);
  }
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) const {
    return vt_->read(self_, name, offset, out);
  }
  result<std::uint64_t> size(std::string_view name) const { return vt_->size(self_, name); }
  result<bool> exists(std::string_view name) const { return vt_->exists(self_, name); }
  result<std::vector<std::string>> list(std::string_view prefix) const {
    return vt_->list(self_, prefix);
  }
  result<void> remove(std::string_view name) const { return vt_->remove(self_, name); }
  std::string describe(std::string_view name) const { return vt_->describe(self_, name); }
  /// What the backend guarantees (see `storage_features`).
  storage_features features() const { return vt_->features(self_); }
  /// The backend's `remove_temporaries` (see `storage_with_temporaries`), or 0 without one.
  result<std::size_t> remove_temporaries(std::string_view prefix) const {
    return vt_->remove_temporaries(self_, prefix);
  }

 private:
  struct vtable {
    result<void> (*put)(void*, std::string_view, std::span<const std::byte>);
    result<std::unique_ptr<object_writer>> (*open_writer)(void*, std::string_view);
    result<void> (*read)(void*, std::string_view, std::uint64_t, std::span<std::byte>);
    result<std::uint64_t> (*size)(void*, std::string_view);
    result<bool> (*exists)(void*, std::string_view);
    result<std::vector<std::string>> (*list)(void*, std::string_view);
    result<void> (*remove)(void*, std::string_view);
    std::string (*describe)(const void*, std::string_view);
    result<std::size_t> (*remove_temporaries)(void*, std::string_view);
    storage_features (*features)(const void*);
  };
  template <class S>
  static constexpr vtable vtable_for = {
      [](void* s, std::string_view n, std::span<const std::byte> d) {
        return static_cast<S*>(s)->put(n, d);
      },
      [](void* s, std::string_view n) { return static_cast<S*>(s)->open_writer(n); },
      [](void* s, std::string_view n, std::uint64_t o, std::span<std::byte> out) {
        return static_cast<S*>(s)->read(n, o, out);
      },
      [](void* s, std::string_view n) { return static_cast<S*>(s)->size(n); },
      [](void* s, std::string_view n) { return static_cast<S*>(s)->exists(n); },
      [](void* s, std::string_view n) { return static_cast<S*>(s)->list(n); },
      [](void* s, std::string_view n) { return static_cast<S*>(s)->remove(n); },
      [](const void* s, std::string_view n) -> std::string {
        return static_cast<const S*>(s)->describe(n);
      },
      [](void* s, std::string_view p) -> result<std::size_t> {
        if constexpr (storage_with_temporaries<S>)
          return static_cast<S*>(s)->remove_temporaries(p);
        else
          return (void)s, (void)p, std::size_t{0};
      },
      [](const void* s) { return storage_features_of(*static_cast<const S*>(s)); },
  };
  void* self_;
  const vtable* vt_;
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/storage-inl.hpp"
#endif
