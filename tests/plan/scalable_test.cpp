// The pure parts of scalable save planning (plan/scalable.hpp), run without a communicator: key
// owners, planning messages, each rank's claims by owner, the owners' plans and the writers'
// indices, checked against what plan_save covers, and hostile messages refused.
#include "cairn/plan/scalable.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/message_check.hpp"

namespace scalable_test {

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

/// What every owner planned and every writer's index, as the two all_to_alls would deliver them.
struct world_plan {
  std::vector<cairn::owner_plan> owners;
  std::vector<cairn::save_index> writers;
};

/// Runs the owner and writer parts for every rank of `d`, passing messages by hand.
inline cairn::result<world_plan> plan_world(const std::vector<rank_desc>& d,
                                            bool validate = true,
                                            cairn::tiling tile = cairn::no_tiles) {
  const int world = static_cast<int>(d.size());
  std::vector<std::vector<cairn::bytes>> claims;
  for (const auto& me : d) claims.push_back(cairn::claims_by_owner(me, world));
  world_plan out;
  for (int o = 0; o < world; ++o) {
    std::vector<cairn::bytes> received;
    for (int r = 0; r < world; ++r) received.push_back(claims[r][o]);
    auto p = cairn::plan_owned(received, validate, /*block_size=*/64, /*split_min_bytes=*/32, tile);
    if (!p) return std::move(p).err();
    out.owners.push_back(std::move(*p));
  }
  for (int w = 0; w < world; ++w) {
    std::vector<cairn::bytes> from;
    for (int o = 0; o < world; ++o) from.push_back(out.owners[o].to_writer[w]);
    out.writers.push_back(cairn::writer_index(from, d[w], w, world, 64, tile));
  }
  return out;
}

/// Rank r of `world` holds rows [2r, 2r + 2) of "rows" (f32 [2 world, 8]); every rank holds all
/// of "rep" (i32 [40], a replica each); rank 0 holds "solo" (bf16 [3, 3]); each rank its "rng".
inline std::vector<rank_desc> sample(int world) {
  std::vector<rank_desc> d(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    auto& me = d[static_cast<std::size_t>(r)];
    me.tensors.push_back(
        tensor_desc{"rows", cairn::dtype::f32, {2 * world, 8}, 0, {box{{2 * r, 0}, {2, 8}}}});
    me.tensors.push_back(tensor_desc{"rep", cairn::dtype::i32, {40}, r, {box{{0}, {40}}}});
    if (r == 0)
      me.tensors.push_back(
          tensor_desc{"solo", cairn::dtype::bf16, {3, 3}, 0, {box{{0, 0}, {3, 3}}}});
    me.objects.push_back(cairn::object_desc{"rng", {world}, {r}, 0, 8});
  }
  return d;
}

/// Whether `me` holds all of `region` of tensor `key` in one of its pieces.
inline bool holds(const rank_desc& me, const std::string& key, const box& region) {
  for (const auto& t : me.tensors)
    if (t.key == key)
      for (const auto& p : t.pieces)
        if (auto x = cairn::intersect(p, region); x && x->volume() == region.volume()) return true;
  return false;
}

}  // namespace scalable_test

using cairn::box;
using cairn::rank_desc;
using cairn::tensor_desc;

TEST_CASE("owner_of spreads keys over the ranks, deterministically") {
  CHECK(cairn::owner_of("w", 0) == 0);
  CHECK(cairn::owner_of("w", 1) == 0);
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) {
    std::string k = "layer." + std::to_string(i);
    int o = cairn::owner_of(k, 7);
    CHECK(o >= 0);
    CHECK(o < 7);
    CHECK(o == static_cast<int>(cairn::key_hash(k) % 7));
    seen.insert(o);
  }
  CHECK(seen.size() == 7);
}

TEST_CASE("planning messages: packed and unpacked, malformed or oversized ones refused") {
  std::mt19937 rng(5);
  cairn::bytes raw(5000);
  for (auto& b : raw) b = static_cast<std::byte>(rng() % 4);
  auto packed = cairn::detail::pack_message(raw);
  CHECK(packed.size() < raw.size());
  CHECK(cairn::detail::unpack_message(packed) == raw);
  CHECK(cairn::detail::unpack_message({}).empty());
  CHECK(cairn::detail::unpack_message(cairn::detail::pack_message({})).empty());

  CHECK_THROWS_AS(cairn::detail::unpack_message(packed, 4999), std::length_error);
  cairn::bytes cut(packed.begin(), packed.end() - 3);
  CHECK_THROWS_AS(cairn::detail::unpack_message(cut), std::length_error);
  cairn::bytes junk(32, std::byte{0x5a});
  CHECK_THROWS_AS(cairn::detail::unpack_message(junk), std::length_error);
}

TEST_CASE("claims_by_owner sends each owner only its keys, with the sender's leaf indices") {
  const int world = 5;
  rank_desc me;
  for (int i = 0; i < 12; ++i)
    me.tensors.push_back(
        tensor_desc{"t" + std::to_string(i), cairn::dtype::f32, {4}, 0, {box{{0}, {4}}}});
  me.objects.push_back(cairn::object_desc{"obj", {1}, {0}, 0, 3});
  auto msgs = cairn::claims_by_owner(me, world);
  REQUIRE(msgs.size() == world);
  auto c = cairn::detail::decode_claims(msgs);
  std::size_t tensors = 0;
  for (int o = 0; o < world; ++o) {
    const auto& part = c.ranks[static_cast<std::size_t>(o)];
    CHECK(msgs[o].empty() == (part.tensors.empty() && part.objects.empty()));
    for (std::size_t i = 0; i < part.tensors.size(); ++i) {
      CHECK(cairn::owner_of(part.tensors[i].key, world) == o);
      CHECK(me.tensors.at(c.tensor_leaf[o][i]).key == part.tensors[i].key);
      ++tensors;
    }
    for (std::size_t i = 0; i < part.objects.size(); ++i) CHECK(c.object_leaf[o][i] == 0);
  }
  CHECK(tensors == me.tensors.size());
}

TEST_CASE("owners and writers together write every element once, from a holder") {
  for (int world : {1, 2, 3, 4}) {
    for (cairn::tiling tile : {cairn::no_tiles, cairn::block_tiles}) {
      INFO("world " << world << " tile " << tile);
      auto d = scalable_test::sample(world);
      auto got = scalable_test::plan_world(d, true, tile);
      REQUIRE(got);
      std::map<std::string, std::vector<int>> hits;
      std::uint64_t total = 0;
      std::set<std::string> objects;
      for (int w = 0; w < world; ++w) {
        auto& L = got->writers[w];
        CHECK(L.partial);
        CHECK(L.world_size == world);
        for (int r = 0; r < world; ++r)
          if (r != w) CHECK(L.slots[r].empty());
        std::uint64_t next = 0;
        for (const auto& s : L.slots[w]) {  // laid out one after the other, in slot order
          const auto& e = L.where(s);
          CHECK(e.file == static_cast<std::uint32_t>(w));
          CHECK(e.byte_offset == next);
          next += e.nbytes;
          if (s.is_object) objects.insert(s.key);
        }
        CHECK(L.bytes_of_rank[w] == next);
        total += next;
        for (const auto& [k, t] : L.tensors) {
          auto& h = hits[k];
          h.resize(static_cast<std::size_t>(cairn::numel(t.global_shape)));
          box whole{cairn::shape(t.global_shape.size(), 0), t.global_shape};
          for (const auto& ch : t.chunks) {
            CHECK(scalable_test::holds(d[w], k, ch.region));
            CHECK(ch.where.nbytes == ch.region.volume() * cairn::dtype_size(t.type));
            cairn::for_each_run(whole, ch.region, ch.region,
                                [&](std::int64_t s, std::int64_t, std::int64_t n) {
                                  for (std::int64_t i = 0; i < n; ++i) ++h[s + i];
                                });
          }
        }
      }
      CHECK(hits.size() == 3);
      for (const auto& [k, h] : hits) {
        INFO(k);
        for (int n : h) CHECK(n == 1);
      }
      CHECK(objects.size() == static_cast<std::size_t>(world));
      // The same bytes as planning everything in one place.
      std::uint64_t whole_plan = 0;
      for (auto b : cairn::plan_save(d, 64, 32, tile).bytes_of_rank) whole_plan += b;
      CHECK(total == whole_plan);
    }
  }
}

TEST_CASE("plan_owned fails naming the key, unvalidated only for a doubly saved object") {
  auto d = scalable_test::sample(3);
  d[1].tensors[0].pieces[0] = box{{1, 0}, {2, 8}};  // overlaps rank 0's rows, leaves row 3
  auto r = scalable_test::plan_world(d);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::integrity);
  CHECK(r.err().key == "rows");
  CHECK(scalable_test::plan_world(d, /*validate=*/false));

  auto twice = scalable_test::sample(3);
  twice[2].objects[0].global_offset = {1};  // ranks 1 and 2 both save rng at 1
  auto o = scalable_test::plan_world(twice, false);
  REQUIRE(!o);
  CHECK(o.err().code == cairn::errc::integrity);
  CHECK(o.err().key == "rng");
  CHECK(o.err().message.find("rank 1 and rank 2") != std::string::npos);
}

TEST_CASE("hostile planning messages are refused, never read past a leaf") {
  auto d = scalable_test::sample(2);
  auto slot_msg = [](std::uint8_t is_object, std::uint64_t leaf, std::uint64_t piece,
                     std::int64_t element, std::int64_t count) {
    cairn::detail::slots_message m;
    if (is_object)
      m.slots.emplace_back(cairn::detail::object_slot_message{leaf});
    else
      m.slots.emplace_back(cairn::detail::tensor_slot_message{leaf, piece, element, count});
    return cairn::detail::pack_message(cairn::detail::encode_message(m));
  };
  auto index = [&](const cairn::bytes& msg) {
    return cairn::writer_index({msg, {}}, d[0], 0, 2, 64, cairn::no_tiles);
  };
  CHECK(index(slot_msg(0, 0, 0, 0, 16)).bytes_of_rank[0] == 64);        // a good slot
  CHECK_THROWS_AS(index(slot_msg(0, 3, 0, 0, 1)), std::length_error);   // no such leaf
  CHECK_THROWS_AS(index(slot_msg(1, 1, 0, 0, 0)), std::length_error);   // no such object
  CHECK_THROWS_AS(index(slot_msg(0, 0, 1, 0, 1)), std::length_error);   // no such piece
  CHECK_THROWS_AS(index(slot_msg(0, 0, 0, 10, 7)), std::length_error);  // past the piece
  CHECK_THROWS_AS(index(slot_msg(0, 0, 0, -1, 2)), std::length_error);
  CHECK_THROWS_AS(index(slot_msg(0, 0, 0, 0, 0)), std::length_error);
  CHECK_THROWS_AS(index(slot_msg(0, 0, 0, 1, std::numeric_limits<std::int64_t>::max())),
                  std::length_error);
  CHECK_THROWS_AS(index(slot_msg(0, 0, 0, 3, 6)), std::length_error);  // not one box
  cairn::detail::message_writer trunc;
  trunc.count(2);  // two slots announced, none there
  try {
    (void)index(cairn::detail::pack_message(trunc.data()));
    FAIL_CHECK("no exception");
  } catch (const cairn::exception& e) {
    CHECK(e.err().code == cairn::errc::comm);
    CHECK(e.err().message.find("malformed planning slots between ranks") == 0);
  }

  // Claims whose leaf index lists disagree with the leaves they index.
  rank_desc part;
  part.tensors.push_back(d[0].tensors[0]);
  auto lying = cairn::encode_claims(part, {}, {});
  CHECK_THROWS_AS(cairn::detail::decode_claims({lying}), std::length_error);
}

TEST_CASE("every planning message round-trips and refuses truncation") {
  auto d = scalable_test::sample(2);
  cairn_test::check_message(d[1]);
  cairn_test::check_message(cairn::detail::claims_message{d[0], {0, 1}, {0}});
  cairn::detail::slots_message slots;
  slots.slots.emplace_back(cairn::detail::object_slot_message{2});
  slots.slots.emplace_back(cairn::detail::tensor_slot_message{1, 2, 3, 4});
  cairn_test::check_message(slots);
  auto bad = cairn::decode_rank_desc(cairn::bytes(3));
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("malformed rank description between ranks") == 0);
}
