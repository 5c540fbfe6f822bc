// dcp::write_streamed (format/dcp/stream_writer.hpp): a source written as a torch_dist
// checkpoint whose items read back through dcp::source, objects and common.pt included; a dtype
// torch 1.13 lacks is refused before anything is written.
#include "cairn/format/dcp/stream_writer.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/dcp/source.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("dcp::write_streamed writes items that read back as a DCP source") {
  cairn::memory_storage ck, out;
  cairn_test::save_source_sample(ck);
  auto src = cairn::stream::catalog_source::open(ck).value();
  auto objects = src->objects().value();
  cairn::stream::stream_settings settings;
  settings.slab_bytes = 32;  // several items per tensor
  cairn::stream::stream_stats stats;
  REQUIRE(
      cairn::dcp::write_streamed(*src, out, cairn::dcp::flavor::torch2, settings, objects, stats));
  CHECK(stats.files ==
        std::vector<std::string>{"__0_0.distcp", "common.pt", "metadata.json", ".metadata"});
  CHECK(stats.objects == 2);
  auto back = cairn::dcp::source::open(out).value();
  const auto& w = std::get<cairn::dcp::tensor_meta>(back->metadata().state_dict_metadata.at("w"));
  CHECK(w.chunks.size() == 3);
  cairn_test::check_reads(*back);
  CHECK(back->commons().value().at("step").as<std::int64_t>() == 42);
  CHECK(back->objects().value() == objects);
}

TEST_CASE("dcp::write_streamed refuses a dtype torch 1.13 lacks before writing anything") {
  cairn_test::memory_source src({{"a", cairn::dtype::f32, {4}}, {"u", cairn::dtype::u32, {3}}});
  cairn::memory_storage out;
  cairn::stream::stream_stats stats;
  auto r = cairn::dcp::write_streamed(src, out, cairn::dcp::flavor::torch1_13, {}, {}, stats);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(r.err().key == "u");
  CHECK(out.list("").value().empty());
  CHECK(src.reads == 0);
}
