// open_source (convert/source.hpp): the source of whatever format is on a storage (native, DCP,
// safetensors), and the error on a storage without a checkpoint.
#include "cairn/convert/source.hpp"

#include <doctest/doctest.h>

#include <span>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("open_source picks the source of whatever format is there") {
  cairn::memory_storage empty;
  auto none = cairn::convert::open_source(empty);
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);  // an empty location
  CHECK(none.err().file == empty.describe(""));

  cairn::memory_storage native, dist, st;
  cairn_test::save_source_sample(native);
  CHECK(cairn::convert::open_source(native).value()->kind() == "cairn");
  cairn::torch_dist_strategy td;
  cairn_test::save_source_sample(dist, &td);
  CHECK(cairn::convert::open_source(dist).value()->kind() == "torch_dist");

  std::vector<float> v{1.0f, 2.0f, 3.0f};
  cairn::safetensors::write_file(st, "model.safetensors",
                                 {{"v", cairn::dtype::f32, {3}, std::as_bytes(std::span(v))}})
      .value();
  auto s = cairn::convert::open_source(st).value();
  CHECK(s->kind() == "safetensors");
  std::vector<float> got(2);
  REQUIRE(s->read_rows("v", 1, 3, std::as_writable_bytes(std::span(got))));
  CHECK(got == std::vector<float>{2.0f, 3.0f});
  auto wrong_size = s->read_rows("v", 0, 1, std::as_writable_bytes(std::span(got)));
  REQUIRE(!wrong_size);  // a buffer of 8 bytes for one element of 4
  CHECK(wrong_size.err().code == cairn::errc::invalid_argument);
}
