// dcp::source (format/dcp/source.hpp): a torch_dist checkpoint listed and read box by box like
// every stream::source, its objects as bytes items, Megatron's common.pt as commons.
#include "cairn/format/dcp/source.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("dcp::source reads a torch_dist checkpoint, its objects as other items") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn_test::save_source_sample(mem, &td);
  auto src = cairn::dcp::source::open(mem).value();
  CHECK(src->kind() == "torch_dist");
  cairn_test::check_reads(*src);
  cairn_test::check_request_errors(*src);
  CHECK(src->other_items() == std::vector<std::string>{"rng/shard_0_2", "rng/shard_1_2"});
  // Megatron's common.pt, decoded as load decodes it, and the objects with their bytes.
  auto commons = src->commons().value();
  CHECK(commons.size() == 1);
  CHECK(commons.count("step") == 1);
  auto objects = src->objects().value();
  REQUIRE(objects.size() == 2);
  CHECK(objects.at("rng/shard_1_2").key == "rng");
  CHECK(objects.at("rng/shard_1_2").global_offset == cairn::shape{1});
  CHECK(!src->world_size());  // DCP does not record it
  CHECK(src->metadata().state_dict_metadata.count("w") == 1);
}
