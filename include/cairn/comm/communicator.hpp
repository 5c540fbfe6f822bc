// cairn/comm/communicator.hpp: the communicator concept (rank, size, all-gather, broadcast,
// barrier; optionally gather and all-to-all) and comm_ref, the non-owning type-erased handle
// used by non-template code.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/message.hpp"

namespace cairn {

/// How long a rank waits in a collective for the others to arrive before it fails, naming the
/// ranks that did not come, by default (`thread_group`, `run_ranks`, `mpi_communicator`):
/// 10 minutes, NCCL's watchdog default. Zero waits forever.
inline constexpr std::chrono::milliseconds default_collective_deadline{10 * 60 * 1000};

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

/// A communicator that also has the collectives whose traffic does not grow with the world
/// size on every rank. Planning at scale uses them; `comm_ref` builds them from `all_gather`
/// for a communicator that lacks them (correct, but every rank then receives everything).
/// - `gather(data, root)`: `root` receives every rank's buffer, indexed by rank; the other
///   ranks receive an empty vector.
/// - `all_to_all(to)`: `to[r]` is what this rank sends to rank r (`to.size() == size()`);
///   returns what every rank sent to this one, indexed by sender.
template <class C>
concept scalable_communicator = communicator<C> &&
    requires(C& c, std::span<const std::byte> in, const std::vector<bytes>& to, int root) {
  { c.gather(in, root) } -> std::same_as<std::vector<bytes>>;
  { c.all_to_all(to) } -> std::same_as<std::vector<bytes>>;
};

/// A communicator that can make a copy of itself for another thread of the same rank: the same
/// ranks, its own messages (never mixed with the original's), usable while the original is in
/// use. `duplicate()` is collective (every rank calls it, in the same order as its other
/// duplicates) and returns null when this communicator cannot be used that way (an MPI library
/// initialized without MPI_THREAD_MULTIPLE). An async save commits on such a copy from its
/// background thread.
template <class C>
concept duplicable_communicator = communicator<C> && requires(C& c) {
  { c.duplicate() } -> std::same_as<std::unique_ptr<C>>;
};

namespace detail {

/// `gather` built from `all_gather`, for a communicator without one.
template <communicator C>
std::vector<bytes> gather_by_all_gather(C& c, std::span<const std::byte> in, int root) {
  std::vector<bytes> all = c.all_gather(in);
  if (c.rank() != root) all.clear();
  return all;
}

/// `all_to_all` built from `all_gather`, for a communicator without one: every rank sends all
/// its messages, length-prefixed, and keeps the ones addressed to it.
template <communicator C>
std::vector<bytes> all_to_all_by_all_gather(C& c, const std::vector<bytes>& to) {
  std::vector<bytes> all = c.all_gather(encode_message(to));
  // Checked after the collective, which every rank must enter: a rank that throws before it
  // would leave the others waiting.
  if (to.size() != all.size())
    throw exception(make_error(errc::invalid_argument, "all_to_all needs one buffer per rank (" +
                                                           std::to_string(all.size()) + "), got " +
                                                           std::to_string(to.size()))
                        .with_rank(c.rank()));
  std::vector<bytes> out(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    result<std::vector<bytes>> sent = decode_message<std::vector<bytes>>(all[r], "all_to_all");
    if (sent && sent->size() != all.size())
      sent = make_error(errc::comm,
                        "malformed all_to_all between ranks: " + std::to_string(sent->size()) +
                            " messages for " + std::to_string(all.size()) + " ranks");
    if (!sent) throw exception(std::move(sent).err().with_rank(static_cast<int>(r)));
    out[r] = std::move((*sent)[static_cast<std::size_t>(c.rank())]);
  }
  return out;
}

}  // namespace detail

class comm_ref;

namespace detail {
/// `comm_ref::duplicate` for a communicator of type C at `c` (defined below comm_ref).
template <class C>
std::shared_ptr<comm_ref> duplicate_erased(void* c);
}  // namespace detail

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
  /// Every rank's buffer on `root` (by rank); an empty vector elsewhere. Built from
  /// `all_gather` when the communicator has no `gather`.
  std::vector<bytes> gather(std::span<const std::byte> in, int root) const {
    return vt_->gather(self_, in, root);
  }
  /// What every rank sent to this one (by sender); `to[r]` goes to rank r. Built from
  /// `all_gather` when the communicator has no `all_to_all`.
  std::vector<bytes> all_to_all(const std::vector<bytes>& to) const {
    return vt_->all_to_all(self_, to);
  }
  /// Whether gather and all_to_all are native (their traffic does not grow with the world on
  /// every rank) rather than built from all_gather.
  bool scalable() const { return vt_->scalable; }
  /// A copy of the communicator for another thread of this rank, owned by the pointer (see
  /// `duplicable_communicator`; collective), or null when it has none.
  std::shared_ptr<comm_ref> duplicate() const { return vt_->duplicate(self_); }

 private:
  struct vtable {
    int (*rank)(const void*);
    int (*size)(const void*);
    std::vector<bytes> (*all_gather)(void*, std::span<const std::byte>);
    void (*broadcast)(void*, bytes&, int);
    void (*barrier)(void*);
    std::vector<bytes> (*gather)(void*, std::span<const std::byte>, int);
    std::vector<bytes> (*all_to_all)(void*, const std::vector<bytes>&);
    std::shared_ptr<comm_ref> (*duplicate)(void*);
    bool scalable;
  };
  template <class C>
  static constexpr vtable vtable_for = {
      [](const void* c) { return static_cast<int>(static_cast<const C*>(c)->rank()); },
      [](const void* c) { return static_cast<int>(static_cast<const C*>(c)->size()); },
      [](void* c, std::span<const std::byte> in) { return static_cast<C*>(c)->all_gather(in); },
      [](void* c, bytes& b, int root) { static_cast<C*>(c)->broadcast(b, root); },
      [](void* c) { static_cast<C*>(c)->barrier(); },
      [](void* c, std::span<const std::byte> in, int root) {
        if constexpr (scalable_communicator<C>)
          return static_cast<C*>(c)->gather(in, root);
        else
          return detail::gather_by_all_gather(*static_cast<C*>(c), in, root);
      },
      [](void* c, const std::vector<bytes>& to) {
        if constexpr (scalable_communicator<C>)
          return static_cast<C*>(c)->all_to_all(to);
        else
          return detail::all_to_all_by_all_gather(*static_cast<C*>(c), to);
      },
      [](void* c) { return detail::duplicate_erased<C>(c); },
      scalable_communicator<C>,
  };
  void* self_;
  const vtable* vt_;
};

namespace detail {

template <class C>
std::shared_ptr<comm_ref> duplicate_erased(void* c) {
  if constexpr (duplicable_communicator<C>) {
    std::unique_ptr<C> copy = static_cast<C*>(c)->duplicate();
    if (!copy) return nullptr;
    // One allocation holds the copy and the reference to it.
    struct owned {
      std::unique_ptr<C> comm;
      comm_ref ref;
    };
    C& target = *copy;
    auto o = std::make_shared<owned>(owned{std::move(copy), comm_ref(target)});
    return std::shared_ptr<comm_ref>(o, &o->ref);
  } else {
    (void)c;
    return nullptr;
  }
}

}  // namespace detail

}  // namespace cairn
