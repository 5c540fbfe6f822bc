// safetensors::write_streamed (format/safetensors/stream_writer.hpp): a source written as one
// file, per-tensor files or size-bounded chunks with the index, converted to another dtype, and
// read back tensor for tensor.
#include "cairn/format/safetensors/stream_writer.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("safetensors::write_streamed writes each split, the index for all but one_file") {
  cairn_test::memory_source src({{"model.a", cairn::dtype::f32, {6, 5}},
                                 {"model.b", cairn::dtype::i64, {9}},
                                 {"model.c", cairn::dtype::bf16, {2, 2, 2}}});
  for (auto split :
       {cairn::safetensors::file_split::one_file, cairn::safetensors::file_split::per_tensor,
        cairn::safetensors::file_split::chunks}) {
    INFO(cairn::safetensors::split_name(split));
    cairn::memory_storage out;
    cairn::safetensors::write_settings ws;
    ws.split = split;
    ws.chunk_size = 80;
    ws.metadata["run"] = "7";
    cairn::stream::stream_settings settings;
    settings.slab_bytes = 24;
    cairn::stream::stream_stats stats;
    REQUIRE(cairn::safetensors::write_streamed(src, out, ws, settings, stats));
    CHECK(stats.tensors == 3);
    const bool indexed = split != cairn::safetensors::file_split::one_file;
    CHECK(out.exists(cairn::safetensors::index_name).value() == indexed);
    CHECK(stats.files.size() == (indexed ? 4u : 1u));  // 3 files (chunks: each alone) + index
    auto back = cairn::stream::catalog_source::open(out).value();
    for (const auto& t : src.tensors()) {
      const auto* got = back->find(t.key);
      REQUIRE(got);
      std::vector<std::byte> bytes(t.nbytes());
      REQUIRE(back->read_box(
          t.key, cairn::box{cairn::shape(t.global_shape.size(), 0), t.global_shape}, bytes));
      CHECK(bytes == src.data_.at(t.key));
    }
    auto h = cairn::safetensors::read_header(out, stats.files.front()).value();
    CHECK(h.metadata.at("run") == "7");
    CHECK(h.metadata.at("format") == "pt");
  }
}

TEST_CASE("safetensors::write_streamed converts floating tensors, keeps integers") {
  cairn_test::memory_source src({{"a", cairn::dtype::f32, {3}}, {"b", cairn::dtype::i64, {2}}});
  cairn::memory_storage out;
  cairn::stream::stream_settings settings;
  settings.to_dtype = cairn::dtype::f64;
  cairn::stream::stream_stats stats;
  REQUIRE(cairn::safetensors::write_streamed(src, out, {}, settings, stats));
  auto h = cairn::safetensors::read_header(out, "model.safetensors").value();
  CHECK(h.find("a")->type == cairn::dtype::f64);
  CHECK(h.find("b")->type == cairn::dtype::i64);
  CHECK(stats.bytes_read == 3 * 4 + 2 * 8);
  CHECK(stats.bytes_written == 3 * 8 + 2 * 8);
}
