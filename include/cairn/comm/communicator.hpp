// cairn/comm/communicator.hpp: the communicator concept (rank, size, all-gather, broadcast,
// barrier) and comm_ref, the non-owning type-erased handle used by non-template code.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "cairn/core/bytes.hpp"

namespace cairn {

/// A group of ranks that run collectives together.
///
/// Every rank calls each collective in the same order, on the thread that called cairn's
/// save or load. Collectives throw `cairn::exception` (errc::comm) when the transport fails;
/// after that the communicator is unusable.
/// - `all_gather(data)`: every rank contributes a buffer of any size; every rank receives all
///   buffers, indexed by rank.
/// - `broadcast(buf, root)`: `buf` on `root` is copied into `buf` on every other rank (resized).
/// - `barrier()`: returns once every rank has entered it.
template <class C>
concept communicator =
    requires(C& c, const C& cc, std::span<const std::byte> in, bytes& buf, int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.all_gather(in) } -> std::same_as<std::vector<bytes>>;
  { c.broadcast(buf, root) } -> std::same_as<void>;
  { c.barrier() } -> std::same_as<void>;
};

/// A non-owning, type-erased reference to any `communicator`. The referenced communicator
/// must outlive it.
class comm_ref {
 public:
  template <communicator C>
  requires(!std::same_as<std::remove_cvref_t<C>, comm_ref>) comm_ref(C& c)
  noexcept  // NOLINT(implicit): any communicator converts
      : self_(&c), vt_(&vtable_for<C>) {}

  int rank() const { return vt_->rank(self_); }
  int size() const { return vt_->size(self_); }
  std::vector<bytes> all_gather(std::span<const std::byte> in) const {
    return vt_->all_gather(self_, in);
  }
  void broadcast(bytes& buf, int root) const { vt_->broadcast(self_, buf, root); }
  void barrier() const { vt_->barrier(self_); }

 private:
  struct vtable {
    int (*rank)(const void*);
    int (*size)(const void*);
    std::vector<bytes> (*all_gather)(void*, std::span<const std::byte>);
    void (*broadcast)(void*, bytes&, int);
    void (*barrier)(void*);
  };
  template <class C>
  static constexpr vtable vtable_for = {
      [](const void* c) { return static_cast<int>(static_cast<const C*>(c)->rank()); },
      [](const void* c) { return static_cast<int>(static_cast<const C*>(c)->size()); },
      [](void* c, std::span<const std::byte> in) { return static_cast<C*>(c)->all_gather(in); },
      [](void* c, bytes& b, int root) { static_cast<C*>(c)->broadcast(b, root); },
      [](void* c) { static_cast<C*>(c)->barrier(); },
  };
  void* self_;
  const vtable* vt_;
};

}  // namespace cairn
