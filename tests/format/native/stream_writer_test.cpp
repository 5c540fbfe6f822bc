// native::write_streamed (format/native/stream_writer.hpp): a source written as a native
// checkpoint that verifies, loads, keeps objects and common values, and comes out byte-identical
// from the same source; a failing source leaves no metadata.json.
#include "cairn/format/native/stream_writer.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("native::write_streamed writes a checkpoint that verifies and reads back") {
  cairn::memory_storage ck, a, b;
  cairn_test::save_source_sample(ck);
  auto src = cairn::stream::catalog_source::open(ck).value();
  auto objects = src->objects().value();
  cairn::stream::stream_settings settings;
  settings.slab_bytes = 24;  // several chunks per tensor
  cairn::stream::stream_stats stats;
  REQUIRE(cairn::native::write_streamed(*src, a, settings, objects, stats));
  CHECK(stats.tensors == 2);
  CHECK(stats.objects == 2);
  CHECK(stats.files.back() == "metadata.json");
  CHECK(cairn::verify_checkpoint(a).value().empty());
  auto m = cairn::read_metadata(a).value();
  CHECK(m.tensors.at("w").chunks.size() == 6);  // a row each
  CHECK(m.objects.size() == 2);
  auto back = cairn::stream::catalog_source::open(a).value();
  cairn_test::check_reads(*back);
  CHECK(back->commons().value().at("step").as<std::int64_t>() == 42);
  CHECK(back->objects().value() == objects);

  // The same source gives the same bytes, file for file.
  cairn::stream::stream_stats again;
  REQUIRE(cairn::native::write_streamed(*src, b, settings, objects, again));
  CHECK(again.files == stats.files);
  for (const auto& f : a.list("").value()) {
    std::vector<std::byte> x(a.size(f).value()), y(b.size(f).value());
    a.read(f, 0, x).value();
    b.read(f, 0, y).value();
    CHECK_MESSAGE(x == y, f);
  }
}

TEST_CASE("native::write_streamed stops at a failing read and commits nothing") {
  cairn_test::memory_source src({{"a", cairn::dtype::f32, {4, 4}}, {"b", cairn::dtype::i64, {3}}});
  src.fail_key = "b";
  cairn::memory_storage out;
  cairn::stream::stream_stats stats;
  auto r = cairn::native::write_streamed(src, out, {}, {}, stats);
  REQUIRE(!r);
  CHECK(r.err().key == "b");
  CHECK(!out.exists("metadata.json").value());
}
