// cairn/pipeline/share-inl.hpp: the bodies of cairn/pipeline/share.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "cairn/core/checksum.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/native/index_file.hpp"
#include "cairn/pipeline/share.hpp"

namespace cairn::detail {

namespace share_impl {

/// A piece's identity: key position, type, offset, size.
using piece_id = std::tuple<std::uint32_t, dtype, shape, shape>;

/// Whether `o` and `s` describe a non-empty box inside `global`.
inline bool box_fits(const shape& o, const shape& s, const shape& global) {
  if (o.size() != global.size() || s.size() != global.size()) return false;
  for (std::size_t d = 0; d < global.size(); ++d)
    if (o[d] < 0 || s[d] <= 0 || o[d] > global[d] || s[d] > global[d] - o[d]) return false;
  return true;
}

/// A list as it travels: nothing at all when it is empty (at 16 384 ranks, 8-byte counts of empty
/// lists would be 128 KiB per exchange), its message otherwise.
template <class T>
bytes encode_list(const std::vector<T>& v) {
  return v.empty() ? bytes{} : encode_message(v);
}

/// The list `b` holds (empty for no bytes), or the decoding error.
template <class T>
result<std::vector<T>> decode_list(const bytes& b, std::string_view what) {
  if (b.empty()) return std::vector<T>{};
  return decode_message<std::vector<T>>(b, what);
}

/// Whether this load shares pieces at all (the same answer on every rank: options and world).
inline bool sharing(const load_options& opt, comm_ref comm) {
  return opt.read_once_broadcast && comm.size() >= 2 && !opt.common_only;
}

/// The streams one rank exchanges in one round: per peer, the pieces in (key, type, box) order,
/// and how far along the stream is (piece, byte within it).
struct stream {
  std::vector<const shared_piece*> pieces;
  std::uint64_t total = 0;
  std::size_t piece = 0;
  std::uint64_t at = 0;
  std::uint64_t done = 0;
};

}  // namespace share_impl

CAIRN_INLINE std::uint64_t piece_hash(std::string_view key, const box& b) {
  bytes buf(key.size());
  std::memcpy(buf.data(), key.data(), key.size());
  put_u32(buf, static_cast<std::uint32_t>(b.offset.size()));
  put_ints(buf, b.offset);
  put_ints(buf, b.size);
  return checksum(buf);
}

CAIRN_INLINE int piece_owner(std::string_view key, const box& b, int world) {
  return static_cast<int>(piece_hash(key, b) % static_cast<std::uint64_t>(std::max(world, 1)));
}

CAIRN_INLINE std::vector<std::vector<piece_route>> route_claims(
    const std::vector<std::vector<piece_claim>>& claims, int first) {
  const int world = static_cast<int>(claims.size());
  std::map<share_impl::piece_id, std::vector<std::pair<int, std::uint32_t>>> groups;
  for (int r = 0; r < world; ++r) {
    const auto& mine = claims[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const piece_claim& c = mine[i];
      auto& members = groups[{c.key, c.type, c.region.offset, c.region.size}];
      if (members.empty() || members.back().first != r)  // a rank claims a piece once
        members.emplace_back(r, static_cast<std::uint32_t>(i));
    }
  }
  std::vector<std::vector<piece_route>> routes(static_cast<std::size_t>(world));
  std::vector<std::uint64_t> load(static_cast<std::size_t>(world), 0);
  for (auto& [id, members] : groups) {
    if (members.size() < 2) continue;
    // The reader: the least loaded member, counting from `first` on.
    auto distance = [&](int r) { return ((r - first) % world + world) % world; };
    std::size_t reader = 0;
    for (std::size_t i = 1; i < members.size(); ++i) {
      const auto a = static_cast<std::size_t>(members[i].first);
      const auto b = static_cast<std::size_t>(members[reader].first);
      if (load[a] < load[b] ||
          (load[a] == load[b] && distance(members[i].first) < distance(members[reader].first)))
        reader = i;
    }
    std::rotate(members.begin(), members.begin() + static_cast<std::ptrdiff_t>(reader),
                members.begin() + static_cast<std::ptrdiff_t>(reader) + 1);
    load[static_cast<std::size_t>(members[0].first)] +=
        static_cast<std::uint64_t>(numel(std::get<3>(id))) * dtype_size(std::get<1>(id));
    // Member i > 0 arrives in round floor(log2 i) from member i - 2^round; member i sends on to
    // i + 2^j in every later round j (every round, for the reader) while there is one.
    const std::size_t g = members.size();
    for (std::size_t i = 0; i < g; ++i) {
      piece_route route;
      route.claim = members[i].second;
      std::size_t next = 0;  // the first round member i sends in
      if (i > 0) {
        const auto round = static_cast<std::size_t>(std::bit_width(i) - 1);
        route.round = static_cast<std::uint8_t>(round);
        route.parent = members[i - (std::size_t{1} << round)].first;
        next = round + 1;
      }
      for (std::size_t j = next; i + (std::size_t{1} << j) < g; ++j)
        route.children.emplace_back(static_cast<std::uint8_t>(j),
                                    members[i + (std::size_t{1} << j)].first);
      routes[static_cast<std::size_t>(members[i].first)].push_back(std::move(route));
    }
  }
  return routes;
}

CAIRN_INLINE std::vector<shared_piece> plan_shared_pieces(const leaf_list& leaves,
                                                          const checkpoint_metadata& m,
                                                          comm_ref comm,
                                                          const load_options& opt) {
  if (!share_impl::sharing(opt, comm)) return {};
  const int world = comm.size();
  const auto w = static_cast<std::size_t>(world);
  // The checkpoint's tensors by position (key order: the same on every rank).
  std::vector<const std::pair<const std::string, tensor_record>*> keys;
  keys.reserve(m.tensors.size());
  for (const auto& kv : m.tensors) keys.push_back(&kv);
  const bool indexable = keys.size() <= std::uint64_t{0xffffffff};
  // This rank's pieces, once each, in (key, type, box) order.
  std::map<share_impl::piece_id, shared_piece> mine;
  for (std::size_t ti = 0; ti < leaves.tensors.size() && indexable; ++ti) {
    const tensor_leaf& t = leaves.tensors[ti];
    const auto at =
        std::lower_bound(keys.begin(), keys.end(), t.sharding.key,
                         [](const auto* kv, const std::string& k) { return kv->first < k; });
    if (at == keys.end() || (*at)->first != t.sharding.key) continue;  // not in the checkpoint
    const auto key = static_cast<std::uint32_t>(at - keys.begin());
    const shape& global = (*at)->second.global_shape;
    const std::size_t es = dtype_size(t.sharding.type);
    auto ps = pieces_of(t.sharding);
    for (std::size_t pi = 0; pi < ps.size(); ++pi) {
      const box& region = ps[pi].region;
      if (!share_impl::box_fits(region.offset, region.size, global)) continue;
      const std::uint64_t n = static_cast<std::uint64_t>(region.volume()) * es;
      if (n < std::max<std::uint64_t>(opt.broadcast_min_bytes, 1)) continue;
      mine.emplace(share_impl::piece_id{key, t.sharding.type, region.offset, region.size},
                   shared_piece{piece_ref{ti, pi}, n, t.data + ps[pi].data_offset * es});
    }
  }
  // Claims to the pieces' owners, remembering what went where.
  std::vector<std::vector<piece_claim>> to_owner(w);
  std::vector<std::vector<const share_impl::piece_id*>> sent(w);
  for (const auto& [id, piece] : mine) {
    const auto& [key, type, offset, size] = id;
    box region{offset, size};
    const auto o = static_cast<std::size_t>(piece_owner(keys[key]->first, region, world));
    to_owner[o].push_back({key, type, std::move(region)});
    sent[o].push_back(&id);
  }
  std::vector<bytes> out(w);
  for (std::size_t r = 0; r < w; ++r) out[r] = share_impl::encode_list(to_owner[r]);
  to_owner.clear();
  std::vector<bytes> got = comm.all_to_all(out);
  // As an owner: check what arrived, route it.
  std::vector<std::vector<piece_claim>> claims(w);
  for (std::size_t r = 0; r < w; ++r) {
    result<std::vector<piece_claim>> c =
        share_impl::decode_list<piece_claim>(got[r], "list of piece claims");
    if (!c) throw exception(std::move(c).err().with_rank(static_cast<int>(r)));
    for (const piece_claim& p : *c)
      if (p.key >= keys.size() || dtype_size(p.type) == 0 ||
          !share_impl::box_fits(p.region.offset, p.region.size, keys[p.key]->second.global_shape))
        throw exception(make_error(errc::comm, "a piece claim names key " + std::to_string(p.key) +
                                                   " of " + std::to_string(keys.size()) +
                                                   " or a box outside it")
                            .with_rank(static_cast<int>(r)));
    claims[r] = std::move(*c);
  }
  std::vector<std::vector<piece_route>> routes = route_claims(claims, comm.rank());
  claims.clear();
  for (std::size_t r = 0; r < w; ++r) out[r] = share_impl::encode_list(routes[r]);
  routes.clear();
  got = comm.all_to_all(out);
  // As a claimant: the routes of the pieces other ranks want too.
  std::map<const share_impl::piece_id*, piece_route> routed;
  for (std::size_t o = 0; o < w; ++o) {
    result<std::vector<piece_route>> rs =
        share_impl::decode_list<piece_route>(got[o], "list of piece routes");
    if (!rs) throw exception(std::move(rs).err().with_rank(static_cast<int>(o)));
    for (piece_route& r : *rs) {
      auto bad = [&](const std::string& what) {
        return exception(
            make_error(errc::comm, "a piece route " + what).with_rank(static_cast<int>(o)));
      };
      auto foreign = [&](std::int32_t rank) {
        return rank < 0 || rank >= world || rank == comm.rank();
      };
      if (r.claim >= sent[o].size())
        throw bad("names claim " + std::to_string(r.claim) + " of " +
                  std::to_string(sent[o].size()));
      if (r.parent != -1 && foreign(r.parent))
        throw bad("names parent rank " + std::to_string(r.parent));
      if (r.round >= 64) throw bad("names round " + std::to_string(r.round));
      for (const auto& [round, rank] : r.children)
        if (foreign(rank) || round >= 64 || (r.parent != -1 && round <= r.round))
          throw bad("sends to rank " + std::to_string(rank) + " in round " + std::to_string(round));
      if (!routed.emplace(sent[o][r.claim], std::move(r)).second) throw bad("names a claim twice");
    }
  }
  std::vector<shared_piece> shared;
  for (const auto& [id, piece] : mine) {  // (key, type, box) order: the same on every rank
    auto it = routed.find(&id);
    if (it == routed.end()) continue;
    shared.push_back(piece);
    shared.back().parent = it->second.parent;
    shared.back().round = it->second.round;
    for (const auto& [round, rank] : it->second.children)
      shared.back().children.emplace_back(round, rank);
  }
  return shared;
}

CAIRN_INLINE std::set<piece_ref> received_pieces(const std::vector<shared_piece>& shared) {
  std::set<piece_ref> out;
  for (const auto& sp : shared)
    if (sp.parent >= 0) out.insert(sp.local);
  return out;
}

CAIRN_INLINE result<bool> deliver_shared_pieces(const std::vector<shared_piece>& shared,
                                                const leaf_list& leaves,
                                                comm_ref comm,
                                                const load_options& opt,
                                                bool ready,
                                                load_stats& stats,
                                                cuda::staging_window* window) {
  if (!share_impl::sharing(opt, comm)) return true;
  const int world = comm.size();
  const auto w = static_cast<std::size_t>(world);
  const std::uint64_t step = std::max<std::uint64_t>(opt.share_step_bytes, 1);
  // This rank's streams, by round and peer, in `shared` order.
  std::map<int, std::map<int, share_impl::stream>> outgoing, incoming;
  for (const auto& sp : shared) {
    if (sp.parent >= 0) {
      auto& s = incoming[sp.round][sp.parent];
      s.pieces.push_back(&sp);
      s.total += sp.nbytes;
    }
    for (const auto& [round, rank] : sp.children) {
      auto& s = outgoing[round][rank];
      s.pieces.push_back(&sp);
      s.total += sp.nbytes;
    }
  }
  std::uint32_t rounds = 0, steps = 0;
  for (const auto* side : {&outgoing, &incoming})
    for (const auto& [round, peers] : *side) {
      rounds = std::max(rounds, static_cast<std::uint32_t>(round + 1));
      for (const auto& [peer, s] : peers)
        steps = std::max(steps, static_cast<std::uint32_t>((s.total + step - 1) / step));
    }
  // Agree on rounds and steps; no delivery when some rank is not ready (it reports why).
  bytes plan;
  plan.push_back(std::byte{ready});
  put_u32(plan, rounds);
  put_u32(plan, steps);
  const std::vector<bytes> plans = comm.all_gather(plan);
  bool all_ready = true;
  for (std::size_t r = 0; r < plans.size(); ++r) {
    if (plans[r].size() != 9)
      throw exception(make_error(errc::comm, "a shared piece schedule of " +
                                                 std::to_string(plans[r].size()) + " bytes")
                          .with_rank(static_cast<int>(r)));
    std::uint32_t n = 0, s = 0;
    std::memcpy(&n, plans[r].data() + 1, 4);
    std::memcpy(&s, plans[r].data() + 5, 4);
    all_ready = all_ready && plans[r][0] == std::byte{1};
    rounds = std::max(rounds, n);
    steps = std::max(steps, s);
  }
  if (!all_ready) return false;
  std::optional<error> failure;
  auto fail = [&](int peer, const shared_piece* sp, const std::string& what) {
    if (failure) return;
    std::string key = sp ? leaves.tensors[sp->local.first].sharding.key : std::string{};
    failure = make_error(errc::comm, "rank " + std::to_string(peer) + " " + what +
                                         " (shared pieces from rank " + std::to_string(peer) + ")")
                  .with_key(std::move(key))
                  .with_rank(comm.rank());
  };
  // Pieces in device memory are read and written through the staging window.
  std::optional<cuda::window_mover> device;
  if (window) device.emplace(*window);
  auto device_failed = [&](const shared_piece& sp, result<void> r) {
    if (r || failure) return;
    failure = std::move(r)
                  .err()
                  .with_key(leaves.tensors[sp.local.first].sharding.key)
                  .with_rank(comm.rank());
  };
  auto on_device = [&](const shared_piece& sp) {
    return leaves.tensors[sp.local.first].on_device && device.has_value();
  };
  for (std::uint32_t round = 0; round < rounds; ++round) {
    auto& out = outgoing[static_cast<int>(round)];
    auto& in = incoming[static_cast<int>(round)];
    for (std::uint32_t k = 0; k < steps; ++k) {
      std::vector<bytes> to(w);
      for (auto& [peer, s] : out) {
        bytes& b = to[static_cast<std::size_t>(peer)];
        while (s.piece < s.pieces.size() && b.size() < step) {
          const shared_piece& sp = *s.pieces[s.piece];
          const std::uint64_t n = std::min<std::uint64_t>(sp.nbytes - s.at, step - b.size());
          if (on_device(sp)) {
            const std::size_t at = b.size();
            b.resize(at + n);
            device_failed(sp, device->get(b.data() + at, sp.data + s.at, n));
          } else {
            b.insert(b.end(), sp.data + s.at, sp.data + s.at + n);
          }
          s.at += n;
          if (s.at == sp.nbytes) ++s.piece, s.at = 0;
        }
        stats.bytes_to_ranks += b.size();
      }
      std::vector<bytes> got = comm.all_to_all(to);
      for (std::size_t r = 0; r < got.size(); ++r) {
        if (got[r].empty()) continue;
        auto it = in.find(static_cast<int>(r));
        if (it == in.end() || got[r].size() > it->second.total - it->second.done) {
          fail(static_cast<int>(r), nullptr,
               "sent " + std::to_string(got[r].size()) + " bytes more than its routes say");
          continue;
        }
        share_impl::stream& s = it->second;
        std::uint64_t used = 0;
        while (used < got[r].size()) {
          const shared_piece& sp = *s.pieces[s.piece];
          const std::uint64_t n = std::min<std::uint64_t>(sp.nbytes - s.at, got[r].size() - used);
          if (on_device(sp))
            device_failed(sp, device->put(sp.data + s.at, got[r].data() + used, n));
          else
            std::memcpy(sp.data + s.at, got[r].data() + used, n);
          used += n;
          s.at += n;
          if (s.at == sp.nbytes) ++s.piece, s.at = 0;
        }
        s.done += used;
        stats.bytes_from_ranks += used;
      }
      // What came in is on the device before the next step sends it on or reuses `got`.
      if (device)
        if (auto f = device->flush(); !f && !failure)
          failure = std::move(f).err().with_rank(comm.rank());
    }
    for (const auto& [peer, s] : in)
      if (s.done != s.total)
        fail(peer, s.pieces[s.piece],
             "sent " + std::to_string(s.done) + " of the " + std::to_string(s.total) +
                 " bytes its routes say in round " + std::to_string(round));
  }
  if (failure) return std::move(*failure);
  return true;
}

}  // namespace cairn::detail
