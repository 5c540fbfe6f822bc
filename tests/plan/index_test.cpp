// The format-neutral checkpoint index (plan/index.hpp): bytes of extents (raw and compressed),
// of tensors and of their chunks, as a save plans them and as a compressed save stores them.
#include "cairn/plan/index.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "cairn/cairn.hpp"

TEST_CASE("extent::stored_bytes is nbytes raw, and the sum of stored blocks when compressed") {
  cairn::extent raw{0, 128, 1000, {1, 2}};
  CHECK(!raw.compressed());
  CHECK(raw.stored_bytes() == 1000);

  cairn::extent packed{1, 0, 1000, {1, 2}, {0, 300}, {300, 17}};
  CHECK(packed.compressed());
  CHECK(packed.stored_bytes() == 317);  // not nbytes, not the block offsets

  cairn::extent empty{};
  CHECK(empty.stored_bytes() == 0);
}

TEST_CASE("tensor_record sizes: whole tensor, chunk data and stored bytes") {
  cairn::tensor_record t;
  t.type = cairn::dtype::bf16;
  t.global_shape = {3, 5};
  CHECK(t.nbytes() == 3 * 5 * 2);
  CHECK(t.chunk_bytes() == 0);
  CHECK(t.stored_bytes() == 0);
  t.chunks.push_back({cairn::box{{0, 0}, {1, 5}}, cairn::extent{0, 0, 10, {}}, {}});
  t.chunks.push_back({cairn::box{{1, 0}, {2, 5}}, cairn::extent{1, 0, 20, {}, {0, 8}, {8, 4}}, {}});
  CHECK(t.chunk_bytes() == 30);
  CHECK(t.stored_bytes() == 10 + 12);

  cairn::tensor_record scalar;
  scalar.type = cairn::dtype::f64;
  CHECK(scalar.nbytes() == 8);  // shape {} holds one element
  cairn::tensor_record hollow;
  hollow.global_shape = {4, 0};
  CHECK(hollow.nbytes() == 0);
}

TEST_CASE("a compressed save stores less than its chunks hold, and chunks hold the tensor") {
  std::vector<float> w(64 * 64, 1.0f);  // compresses well
  std::vector<float> r(64);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<float>(i * 2654435761u % 977);
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {64, 64}, {}));
  sd.add("r", cairn::from_rank_offsets("r", std::span(r), {64}, {}));
  cairn::save(sd, mem, one, {.block_size = 4096, .zstd_level = 3});
  auto m = cairn::read_metadata(mem).value();
  const auto& tw = m.tensors.at("w");
  CHECK(tw.chunk_bytes() == tw.nbytes());
  CHECK(tw.stored_bytes() < tw.chunk_bytes());
  std::uint64_t stored = 0;
  for (const auto& c : tw.chunks) {
    if (!c.where.compressed()) continue;
    CHECK(c.where.block_offsets.size() == c.where.block_stored.size());
    stored += c.where.stored_bytes();
  }
  CHECK(stored > 0);
  // Every extent lies inside its file.
  for (const auto& [k, t] : m.tensors)
    for (const auto& c : t.chunks) {
      INFO(k);
      auto size = mem.size(m.files.at(c.where.file).name).value();
      if (c.where.compressed())
        for (std::size_t b = 0; b < c.where.block_stored.size(); ++b)
          CHECK(c.where.block_offsets[b] + c.where.block_stored[b] <= size);
      else
        CHECK(c.where.byte_offset + c.where.nbytes <= size);
    }
}
