// Pieces several ranks of a load want alike (pipeline/share.hpp): routed by the pieces' owners
// into binomial trees, read once per group (data-parallel replicas included), passed on in
// bounded steps, and refused when a peer sends what its routes do not say.
#include "cairn/pipeline/share.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/counting_comm.hpp"
#include "tests/support/leaf.hpp"
#include "tests/support/message_check.hpp"

namespace pipeline_share_test {

/// Checks the routes of one group: every member but one has a parent; following parents from any
/// member reaches the reader, each hop arriving in an earlier round; every member is sent the
/// piece exactly once, by its parent, in the round it expects it.
inline void check_tree(const std::map<int, cairn::detail::piece_route>& members) {
  int readers = 0;
  std::map<int, int> sent_to;  // rank -> times some member sends to it
  for (const auto& [rank, route] : members) {
    readers += route.parent == -1;
    for (const auto& [round, child] : route.children) {
      REQUIRE(members.count(child));
      CHECK(members.at(child).parent == rank);
      CHECK(members.at(child).round == round);
      if (route.parent != -1) CHECK(round > route.round);
      ++sent_to[child];
    }
  }
  CHECK(readers == 1);
  for (const auto& [rank, route] : members)
    if (route.parent != -1) CHECK(sent_to[rank] == 1);
}

}  // namespace pipeline_share_test

TEST_CASE("route_claims builds one binomial tree per piece claimed by two ranks or more") {
  using cairn::detail::piece_claim;
  constexpr int world = 11;
  const piece_claim a{0, cairn::dtype::f32, {{0}, {100}}};
  const piece_claim b{1, cairn::dtype::bf16, {{0, 0}, {4, 4}}};
  const piece_claim b_as_f32{1, cairn::dtype::f32, {{0, 0}, {4, 4}}};
  const piece_claim c{2, cairn::dtype::f32, {{8}, {8}}};
  std::vector<std::vector<piece_claim>> claims(world);
  for (int r = 0; r < world; ++r) claims[static_cast<std::size_t>(r)].push_back(a);  // everyone
  claims[1].push_back(b);
  claims[3].push_back(b);
  claims[3].push_back(b);         // a rank that claims twice is a member once
  claims[5].push_back(b_as_f32);  // another type: another piece, alone
  claims[4].push_back(c);         // alone
  auto routes = cairn::detail::route_claims(claims, 7);
  REQUIRE(routes.size() == world);
  std::map<int, cairn::detail::piece_route> tree_a, tree_b;
  for (int r = 0; r < world; ++r)
    for (const auto& route : routes[static_cast<std::size_t>(r)]) {
      const piece_claim& claimed = claims[static_cast<std::size_t>(r)].at(route.claim);
      if (claimed.key == 0)
        tree_a[r] = route;
      else if (claimed.key == 1 && claimed.type == cairn::dtype::bf16)
        tree_b[r] = route;
      else
        FAIL("a route for a piece nobody else wants");
    }
  CHECK(tree_a.size() == world);
  CHECK(tree_b.size() == 2);
  pipeline_share_test::check_tree(tree_a);
  pipeline_share_test::check_tree(tree_b);
  // 11 members: the last arrives in round 3 (ceil(log2 11) rounds); the reader sends 4 times.
  int deepest = 0, reader_a = -1, reader_b = -1;
  for (const auto& [r, route] : tree_a) {
    if (route.parent == -1) {
      reader_a = r;
      CHECK(route.children.size() == 4);
    }
    deepest = std::max<int>(deepest, route.round);
  }
  for (const auto& [r, route] : tree_b)
    if (route.parent == -1) reader_b = r;
  CHECK(deepest == 3);
  CHECK(reader_a == 7);  // nobody is loaded yet: the first rank from `first` on
  CHECK(reader_b != reader_a);
}

TEST_CASE("the share messages round-trip and refuse truncation") {
  cairn_test::check_message(std::vector<cairn::detail::piece_claim>{
      {3, cairn::dtype::bf16, cairn::box{{0, 8}, {4, 8}}}, {0, cairn::dtype::f32, {{2}, {2}}}});
  cairn_test::check_message(
      std::vector<cairn::detail::piece_route>{{2, -1, 0, {{0, 5}, {1, 9}}}, {0, 4, 2, {}}});
}

TEST_CASE("pieces several ranks ask for alike are read by one and passed on to the others") {
  cairn::memory_storage mem;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> b(40000), w(6);
    for (int i = 0; i < 40000; ++i) b[static_cast<std::size_t>(i)] = static_cast<float>(i % 1000);
    cairn::state_dict sd;
    sd.add("b", cairn::from_rank_offsets("b", std::span(b), {40000}, {}, comm.rank()));
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {{0, comm.rank(), 2}}));
    cairn::save(sd, mem, comm);
  });
  auto m = cairn::read_metadata(mem).value();
  std::vector<int> readers(5, -2);
  cairn::run_ranks(5, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> b(40000, -1.0f), b2(40000, -1.0f), half(20000, -1.0f), w(3, -1.0f);
    cairn::leaf_list leaves;
    leaves.tensors.push_back(cairn_test::f32_leaf("b", b, {40000}, {{0}, {40000}}));
    leaves.tensors.push_back(cairn_test::f32_leaf("b", b2, {40000}, {{0}, {40000}}));
    // The first half of b, wanted by ranks 0 and 2 only.
    if (r % 2 == 0 && r < 4)
      leaves.tensors.push_back(cairn_test::f32_leaf("b", half, {40000}, {{0}, {20000}}));
    // Small, and different on every rank: never shared.
    leaves.tensors.push_back(cairn_test::f32_leaf("w", w, {2, 3}, {{r % 2, 0}, {1, 3}}));
    auto shared = cairn::detail::plan_shared_pieces(leaves, m, comm, {});
    REQUIRE(shared.size() == (r == 0 || r == 2 ? 2u : 1u));  // b's two local copies are one
    const auto whole = std::find_if(shared.begin(), shared.end(),
                                    [](const auto& sp) { return sp.nbytes == 160000; });
    REQUIRE(whole != shared.end());
    readers[static_cast<std::size_t>(r)] = whole->parent;
    CHECK(
        cairn::detail::plan_shared_pieces(leaves, m, comm, {.read_once_broadcast = false}).empty());
    CHECK(cairn::detail::plan_shared_pieces(leaves, m, comm, {.broadcast_min_bytes = 1 << 20})
              .empty());
    // What a reader holds reaches every rank of its group, in steps of 4 KiB here.
    std::uint64_t expected = 0;
    for (const auto& sp : shared) {
      if (sp.parent == -1)
        for (std::uint64_t i = 0; i < sp.nbytes / 4; ++i)
          reinterpret_cast<float*>(sp.data)[i] = sp.nbytes == 80000 ? 4.0f : 3.0f;
      else
        expected += sp.nbytes;
    }
    CHECK(cairn::detail::received_pieces(shared).size() == (expected == 0        ? 0u
                                                            : expected == 240000 ? 2u
                                                                                 : 1u));
    cairn::load_stats stats;
    auto done = cairn::detail::deliver_shared_pieces(shared, leaves, comm,
                                                     {.share_step_bytes = 4096}, true, stats);
    REQUIRE(done);
    CHECK(*done);
    const auto& got = whole->local.first == 0 ? b : b2;
    CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 3.0f; }));
    if (r == 0 || r == 2)
      CHECK(std::all_of(half.begin(), half.end(), [](float x) { return x == 4.0f; }));
    CHECK(stats.bytes_from_ranks == expected);
  });
  CHECK(std::count(readers.begin(), readers.end(), -1) == 1);  // b has one reader
}

TEST_CASE("a load reads each data-parallel replica of a tensor-parallel shard once") {
  // 8 ranks: tensor parallel 2 x data parallel 4. Each weight's row halves are held by the 4
  // data-parallel ranks of their tensor-parallel rank; each bias by all 8.
  constexpr int world = 8, layers = 6;
  cairn::memory_storage mem;
  const auto state = [](int r, std::vector<float>& w, std::vector<float>& b,
                        cairn::state_dict& sd) {
    const int tp = r % 2, dp = r / 2;
    for (int i = 0; i < layers; ++i) {
      const std::string wk = "layer" + std::to_string(i) + ".weight";
      const std::string bk = "layer" + std::to_string(i) + ".bias";
      sd.add(wk, cairn::from_rank_offsets(wk, std::span(w).subspan(1024 * i, 1024), {32, 32},
                                          {{0, tp, 2}}, dp));
      sd.add(bk, cairn::replicated(bk, std::span(b).subspan(256 * i, 256), {256}, r));
    }
  };
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(layers * 1024), b(layers * 256);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>((comm.rank() % 2) * 100000 + static_cast<int>(i));
    std::iota(b.begin(), b.end(), 0.5f);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    cairn::save(sd, mem, comm);
  });
  std::vector<cairn::load_stats> stats(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(layers * 1024, -1.0f), b(layers * 256, -1.0f);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    stats[static_cast<std::size_t>(comm.rank())] =
        cairn::load(sd, mem, comm, {.broadcast_min_bytes = 1024, .share_step_bytes = 1000});
    for (std::size_t i = 0; i < w.size(); ++i)
      REQUIRE(w[i] == static_cast<float>((comm.rank() % 2) * 100000 + static_cast<int>(i)));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == static_cast<float>(i) + 0.5f);
  });
  std::uint64_t read = 0, from_ranks = 0, to_ranks = 0;
  for (const auto& s : stats) {
    read += s.bytes_read;
    from_ranks += s.bytes_from_ranks;
    to_ranks += s.bytes_to_ranks;
  }
  // Read once: 6 weights of 8 KiB and 6 biases of 1 KiB; the rest came from other ranks.
  const std::uint64_t unique = layers * (64 * 32 * 4 + 256 * 4);
  const std::uint64_t wanted = layers * (world * 32 * 32 * 4 + world * 256 * 4);
  CHECK(read == unique);
  CHECK(from_ranks == wanted - unique);
  CHECK(to_ranks == from_ranks);
}

TEST_CASE("a load on 64 ranks shares pieces without gathering every rank's requests") {
  constexpr int world = 64;
  cairn::memory_storage mem;
  const auto state = [](int r, std::vector<float>& w, std::vector<float>& b,
                        cairn::state_dict& sd) {
    for (int i = 0; i < 64; ++i) {
      const std::string wk = "layer" + std::to_string(i) + ".weight";
      const std::string bk = "layer" + std::to_string(i) + ".bias";
      sd.add(wk, cairn::from_rank_offsets(wk, std::span(w).subspan(16 * i, 16), {2, 8},
                                          {{0, r, world}}));
      sd.add(bk, cairn::replicated(bk, std::span(b).subspan(8 * i, 8), {8}, r));
    }
  };
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(64 * 16), b(64 * 8);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(comm.rank() * 10000 + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    cairn::save(sd, mem, comm);
  });
  std::vector<std::size_t> exchanged(world);
  std::vector<cairn::load_stats> stats(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    std::vector<cairn_test::collective_use> log;
    cairn_test::counting_comm comm{tc, &log};
    std::vector<float> w(64 * 16, -1.0f), b(64 * 8, -1.0f);
    cairn::state_dict sd;
    state(tc.rank(), w, b, sd);
    // Every bias (32 bytes) is asked for by every rank: all are shared with this threshold.
    stats[static_cast<std::size_t>(tc.rank())] =
        cairn::load(sd, mem, comm, {.broadcast_min_bytes = 32});
    for (std::size_t i = 0; i < w.size(); ++i)
      REQUIRE(w[i] == static_cast<float>(tc.rank() * 10000 + i));
    for (std::size_t i = 0; i < b.size(); ++i) REQUIRE(b[i] == static_cast<float>(i));
    std::size_t received = 0;
    for (const auto& u : log)
      if (u.kind != "broadcast") received += u.received;
    exchanged[static_cast<std::size_t>(tc.rank())] = received;
  });
  std::size_t most = *std::max_element(exchanged.begin(), exchanged.end());
  MESSAGE("most bytes a rank received outside broadcasts: " << most);
  // Every rank asks for 128 pieces (about 60 bytes each encoded): gathering every rank's
  // requests would bring each rank 491 KB. A rank receives the claims on the pieces it owns, a
  // route per bias and the biases it is passed (2 KiB); the metadata is broadcast.
  CHECK(most < 64 * 1024);
  std::uint64_t from_ranks = 0;
  for (const auto& s : stats) from_ranks += s.bytes_from_ranks;
  CHECK(from_ranks == 63u * 64 * 32);  // every bias read once, passed to the 63 others
}

TEST_CASE("a load whose ranks share pieces only within their stage passes them there") {
  // 16 ranks in 2 pipeline stages of 8: each stage holds its own 32 weights, split by rows over
  // its 8 ranks, and its own replicated biases, which its 8 ranks share.
  constexpr int world = 16;
  cairn::memory_storage mem;
  const auto state = [](int r, std::vector<float>& w, std::vector<float>& b,
                        cairn::state_dict& sd) {
    const int stage = r / 8;
    for (int i = 0; i < 32; ++i) {
      const std::string layer = "layer" + std::to_string(2 * i + stage);
      sd.add(layer + ".weight",
             cairn::from_rank_offsets(layer + ".weight", std::span(w).subspan(16 * i, 16), {2, 8},
                                      {{0, r % 8, 8}}));
      sd.add(layer + ".bias",
             cairn::replicated(layer + ".bias", std::span(b).subspan(8 * i, 8), {8}, r % 8));
    }
  };
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(32 * 16), b(32 * 8);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(comm.rank() * 1000 + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(comm.rank() / 8 + i);
    cairn::state_dict sd;
    state(comm.rank(), w, b, sd);
    cairn::save(sd, mem, comm);
  });
  std::vector<cairn::load_stats> stats(world);
  std::vector<std::size_t> broadcasts(world);
  cairn::run_ranks(world, [&](cairn::thread_communicator& tc) {
    std::vector<cairn_test::collective_use> log;
    cairn_test::counting_comm comm{tc, &log};
    std::vector<float> w(32 * 16, -1.0f), b(32 * 8, -1.0f);
    cairn::state_dict sd;
    state(tc.rank(), w, b, sd);
    stats[static_cast<std::size_t>(tc.rank())] =
        cairn::load(sd, mem, comm, {.broadcast_min_bytes = 32});
    for (std::size_t i = 0; i < w.size(); ++i)
      REQUIRE(w[i] == static_cast<float>(tc.rank() * 1000 + i));
    for (std::size_t i = 0; i < b.size(); ++i)
      REQUIRE(b[i] == static_cast<float>(tc.rank() / 8 + i));
    std::size_t n = 0;
    for (const auto& u : log) n += u.kind == "broadcast";
    broadcasts[static_cast<std::size_t>(tc.rank())] = n;
  });
  std::uint64_t read = 0, from_ranks = 0;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(broadcasts[static_cast<std::size_t>(r)] == 1);  // the metadata only
    read += stats[static_cast<std::size_t>(r)].bytes_read;
    from_ranks += stats[static_cast<std::size_t>(r)].bytes_from_ranks;
  }
  // Each stage's 32 biases are read once and passed to its 7 other ranks; weights are private.
  CHECK(from_ranks == 2u * 32 * 7 * 32);
  CHECK(read == 2u * 32 * (8 * 64 + 32));
}

TEST_CASE("a failing reader stops the delivery: every rank gets its error, none hangs") {
  constexpr int world = 4;
  cairn::memory_storage mem;
  cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
    std::vector<float> b(4096, 2.0f);
    cairn::state_dict sd;
    sd.add("b", cairn::replicated("b", std::span(b), {4096}, comm.rank()));
    cairn::save(sd, mem, comm);
  });
  const auto m = cairn::read_metadata(mem).value();
  int failures = 0;
  for (int failing = 0; failing < world; ++failing) {
    CAPTURE(failing);
    std::vector<std::optional<cairn::error>> errors(world);
    cairn::run_ranks(world, [&](cairn::thread_communicator& comm) {
      cairn::faulty_storage faulty{mem};
      if (comm.rank() == failing)
        for (const auto& f : m.files)
          if (f.role != cairn::file_role::index) faulty.fail_reads_of(f.name);
      std::vector<float> b(4096, -1.0f);
      cairn::state_dict sd;
      sd.add("b", cairn::replicated("b", std::span(b), {4096}, comm.rank()));
      auto r = cairn::try_load(sd, faulty, comm, {.broadcast_min_bytes = 1024});
      if (!r) errors[static_cast<std::size_t>(comm.rank())] = r.err();
    });
    // Only b's reader reads its data: when that is the failing rank, every rank reports its
    // error; otherwise nothing fails.
    const bool failed = errors[0].has_value();
    failures += failed;
    for (const auto& e : errors) {
      CHECK(e.has_value() == failed);
      if (e) CHECK(e->rank == failing);
    }
  }
  CHECK(failures == 1);
}

TEST_CASE("a peer that sends what its routes do not say is an error naming it and the key") {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> x(16, 1.0f), y(16, 1.0f);
    cairn::leaf_list leaves;
    leaves.tensors.push_back(cairn_test::f32_leaf("x", x, {16}, {{0}, {16}}));
    leaves.tensors.push_back(cairn_test::f32_leaf("y", y, {16}, {{0}, {16}}));
    // Rank 0 sends x alone; rank 1 expects x and y from it.
    std::vector<cairn::detail::shared_piece> shared;
    auto piece = [&](std::size_t leaf, std::vector<float>& v) {
      cairn::detail::shared_piece sp{{leaf, 0}, 64, reinterpret_cast<std::byte*>(v.data())};
      if (comm.rank() == 0)
        sp.children.emplace_back(0, 1);
      else
        sp.parent = 0;
      return sp;
    };
    shared.push_back(piece(0, x));
    if (comm.rank() == 1) shared.push_back(piece(1, y));
    cairn::load_stats stats;
    auto r = cairn::detail::deliver_shared_pieces(shared, leaves, comm, {}, true, stats);
    if (comm.rank() == 0) {
      CHECK(r);
    } else {
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::comm);
      CHECK(r.err().key == "y");
      CHECK(r.err().message.find("rank 0") != std::string::npos);
    }
  });
}
