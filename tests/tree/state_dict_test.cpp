// Factories (a leaf saved as several leaves and merged back) and the common-state hook.
#include <doctest/doctest.h>

#include "tests/support/test_util.hpp"

namespace {

/// A fused [3*d] QKV vector per rank, saved as three tensors q, k, v split over ranks.
struct fused_state {
  std::vector<float> qkv;
  cairn::factory parts;
  static constexpr auto fields = cairn::field_names("", "attn");
};

void make(fused_state& s, int rank, int world, int d, float seed) {
  s.qkv.resize(3 * d);
  for (int i = 0; i < 3 * d; ++i) s.qkv[i] = seed + static_cast<float>(rank * 100 + i);
  s.parts.build = [&s, rank, world, d] {
    cairn::state_dict sd;
    const char* names[] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
      // Each part is a copy in memory the built state_dict owns.
      auto buf = sd.allocate<float>(d);
      std::copy(s.qkv.begin() + p * d, s.qkv.begin() + (p + 1) * d, buf.begin());
      sd.add(names[p], cairn::from_rank_offsets(std::string("attn.") + names[p], buf, {d},
                                                {{0, rank, world}}));
    }
    return sd;
  };
  s.parts.merge = [&s, d](cairn::state_dict& sd) -> cairn::result<void> {
    const char* names[] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
      auto& t = std::get<cairn::sharded_tensor<>>(*sd.find(names[p]));
      std::memcpy(s.qkv.data() + p * d, t.data.data(), t.data.size());
    }
    return cairn::ok();
  };
}

}  // namespace

TEST_CASE("a factory saves a fused tensor as parts and merges them back on load") {
  cairn::memory_storage mem;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    fused_state s;
    make(s, comm.rank(), 2, 4, 1.0f);
    cairn::save(s, mem, comm);
  });
  auto m = cairn::read_metadata(mem).value();
  CHECK(m.tensors.count("attn.q") == 1);
  CHECK(m.tensors.at("attn.k").global_shape == cairn::shape{8});
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    fused_state s;
    make(s, comm.rank(), 2, 4, 0.0f);
    std::fill(s.qkv.begin(), s.qkv.end(), -1.0f);
    cairn::load(s, mem, comm);
    for (int i = 0; i < 12; ++i)
      CHECK(s.qkv[i] == 1.0f + static_cast<float>(comm.rank() * 100 + i));
  });
}

TEST_CASE(
    "block with prepended axes and uneven rows, flattened into distributed-optimizer slices") {
  // A [3, 5, 4] f32 tensor of 3 stacked layers (the layer axis is prepended: no rank holds it
  // locally). Rank r < 3 holds layer r, rows [0, 3) or [3, 5) (uneven), as two flat slices
  // held by ranks 2k and 2k + 1.
  const cairn::shape global{3, 5, 4};
  cairn::memory_storage mem;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    std::vector<std::vector<float>> keep;
    for (int layer = 0; layer < 3; ++layer)
      for (int part = 0; part < 2; ++part) {
        const int owner = (layer * 2 + part) % comm.size();
        if (owner != comm.rank()) continue;
        const std::int64_t row0 = part == 0 ? 0 : 3, rows = part == 0 ? 3 : 2;
        std::vector<std::byte> bytes(static_cast<std::size_t>(rows * 4 * 4));
        cairn_test::fill_block("w", cairn::dtype::f32, global,
                               cairn::box{{layer, row0, 0}, {1, rows, 4}}, bytes.data());
        auto whole = cairn::block("w", std::span<float>{}, {rows, 4}, global, {layer, row0, 0}, 0,
                                  /*prepend_axis_num=*/1);
        CHECK(whole.global_block_shape() == cairn::shape{1, rows, 4});
        // Two flat slices of the block: the first `cut` elements, then the rest.
        const std::int64_t n = rows * 4, cut = n / 2 + 1;
        for (auto [b, e] : {std::pair{std::int64_t{0}, cut}, std::pair{cut, n}}) {
          auto& slice = keep.emplace_back(static_cast<std::size_t>(e - b));
          std::memcpy(slice.data(), bytes.data() + b * 4, slice.size() * 4);
          sd.add("w" + std::to_string(layer) + "." + std::to_string(part) + "." + std::to_string(b),
                 cairn::flattened(whole, std::span(slice), cairn::flat_range{b, e}));
        }
      }
    cairn::save(sd, mem, comm);
  });
  auto t = cairn::load_tensors(mem, {"w"}).value();
  std::vector<std::byte> want(3 * 5 * 4 * 4);
  cairn_test::fill_block("w", cairn::dtype::f32, global, cairn::box{{0, 0, 0}, global},
                         want.data());
  CHECK(t.at("w").global_shape == global);
  CHECK(t.at("w").data == want);
}
