// cairn/format/native/box_reader.hpp: read_length of a planned read; read_boxes reads any box
// of a saved tensor (across chunks saved by two ranks, with 16-byte checksum blocks), counts
// what it needed and read, and names the key of a tensor the checkpoint lacks.
#include "cairn/format/native/box_reader.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/comm/threads.hpp"

namespace box_reader_test {

/// "w": f32 [4, 6] holding 0..23, rows 0-1 saved by rank 0 and rows 2-3 by rank 1.
inline void save_rows(cairn::storage_ref st) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> w(12);
    for (int i = 0; i < 12; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(12 * r + i);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 6}, {{0, r, 2}}));
    cairn::save(sd, st, comm, {.block_size = 16});
  });
}

}  // namespace box_reader_test

TEST_CASE("read_length covers whole blocks, the last cut at the chunk's end") {
  cairn::chunk_record c{cairn::box{{0}, {10}}, cairn::extent{0, 0, 40, {}}, {}};
  CHECK(cairn::detail::read_length({&c, 0, 0, nullptr, 0}, 16) == 16);
  CHECK(cairn::detail::read_length({&c, 0, 2, nullptr, 0}, 16) == 40);
  CHECK(cairn::detail::read_length({&c, 1, 2, nullptr, 0}, 16) == 24);
  CHECK(cairn::detail::read_length({&c, 2, 2, nullptr, 0}, 16) == 8);
  CHECK(cairn::detail::read_length({&c, 0, 0, nullptr, 0}, 64) == 40);
}

TEST_CASE("read_boxes reads a box across the chunks of two ranks, verified") {
  cairn::memory_storage st;
  box_reader_test::save_rows(st);
  auto m = cairn::read_any_metadata(st);
  REQUIRE(m.has_value());
  // Rows 1-2, columns 2-4: half from each rank's chunk.
  std::vector<float> got(6, -1.0f);
  std::vector<float> col(4, -1.0f);
  auto counts =
      cairn::read_boxes(st, *m,
                        {{"w", cairn::box{{1, 2}, {2, 3}}, std::as_writable_bytes(std::span(got))},
                         {"w", cairn::box{{0, 5}, {4, 1}}, std::as_writable_bytes(std::span(col))}},
                        2);
  REQUIRE(counts.has_value());
  CHECK(got == std::vector<float>{8, 9, 10, 14, 15, 16});
  CHECK(col == std::vector<float>{5, 11, 17, 23});
  CHECK(counts->bytes_needed == (6 + 4) * 4);
  CHECK(counts->bytes_read >= counts->bytes_needed);
}

TEST_CASE("read_boxes names a tensor the checkpoint lacks, and refuses a box outside it") {
  cairn::memory_storage st;
  box_reader_test::save_rows(st);
  auto m = cairn::read_any_metadata(st).value();
  std::vector<float> out(4);
  auto missing = cairn::read_boxes(
      st, m, {{"nope", cairn::box{{0}, {4}}, std::as_writable_bytes(std::span(out))}}, 1);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == cairn::errc::not_found);
  CHECK(missing.err().key == "nope");
  auto outside = cairn::read_boxes(
      st, m, {{"w", cairn::box{{3, 4}, {2, 2}}, std::as_writable_bytes(std::span(out))}}, 1);
  std::vector<float> small(3);
  auto wrong_size = cairn::read_boxes(
      st, m, {{"w", cairn::box{{0, 0}, {2, 2}}, std::as_writable_bytes(std::span(small))}}, 1);
  REQUIRE_FALSE(wrong_size.has_value());
  CHECK(wrong_size.err().message.find("needs 16 bytes, got 12") != std::string::npos);
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.err().code == cairn::errc::invalid_argument);
  CHECK(outside.err().key == "w");
  CHECK(outside.err().message.find("[3:5, 4:6]") != std::string::npos);
}
