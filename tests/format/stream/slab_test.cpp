// The slab engine (format/stream/slab.hpp): slabs cut tensors into bounded row-major boxes,
// dtype conversion, and `pump` moving a source's tensors slab by slab into a sink, in order,
// within the byte bound, converting, and stopping at the first error.
#include "cairn/format/stream/slab.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "tests/support/source_check.hpp"

TEST_CASE("slabs cut tensors into contiguous row-major boxes within the byte bound") {
  auto check = [](const cairn::shape& dims, std::size_t es, std::uint64_t max) {
    auto bs = cairn::stream::slabs(dims, es, max);
    std::int64_t next = 0;
    for (const auto& b : bs) {
      CHECK(static_cast<std::uint64_t>(b.volume()) * es <= std::max<std::uint64_t>(max, es));
      std::int64_t flat = 0;
      for (std::size_t a = 0; a < dims.size(); ++a) flat = flat * dims[a] + b.offset[a];
      CHECK(flat == next);
      next += b.volume();
    }
    CHECK(next == cairn::numel(dims));
  };
  check({16, 6}, 4, 100);
  check({3, 4, 5}, 2, 7);
  check({1000}, 8, 64);
  check({2, 3, 1000}, 1, 333);
  check({7}, 4, 1 << 20);
  CHECK(cairn::stream::slabs({}, 4, 8).size() == 1);
  CHECK(cairn::stream::slabs({0, 3}, 4, 8).size() == 1);
}

TEST_CASE("convert_elements widens exactly and narrows to nearest even") {
  const std::vector<float> in{1.0f, -2.5f, 0.0f, 65504.0f, 1.0f / 3.0f};
  std::vector<std::uint16_t> bf(in.size());
  std::vector<double> wide(in.size());
  cairn::stream::convert_elements(cairn::dtype::f32, cairn::dtype::f64,
                                  std::as_bytes(std::span(in)),
                                  std::as_writable_bytes(std::span(wide)));
  for (std::size_t i = 0; i < in.size(); ++i) CHECK(wide[i] == static_cast<double>(in[i]));
  cairn::stream::convert_elements(cairn::dtype::f32, cairn::dtype::bf16,
                                  std::as_bytes(std::span(in)),
                                  std::as_writable_bytes(std::span(bf)));
  std::vector<float> back(in.size());
  cairn::stream::convert_elements(cairn::dtype::bf16, cairn::dtype::f32,
                                  std::as_bytes(std::span(bf)),
                                  std::as_writable_bytes(std::span(back)));
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == -2.5f);
  CHECK(back[2] == 0.0f);
  CHECK(back[4] != in[4]);  // 1/3 has more bits than bf16 keeps
  CHECK(std::abs(back[4] - in[4]) < 1e-2f);
  CHECK(cairn::stream::output_dtype(cairn::dtype::i64, cairn::dtype::bf16) == cairn::dtype::i64);
  CHECK(cairn::stream::output_dtype(cairn::dtype::f16, cairn::dtype::bf16) == cairn::dtype::bf16);
  CHECK(cairn::stream::output_dtype(cairn::dtype::f16, std::nullopt) == cairn::dtype::f16);
}

TEST_CASE("pump hands every slab over in order, bounded, converted, then stops at an error") {
  cairn_test::memory_source src({{"a", cairn::dtype::f32, {10, 3}},
                                 {"b", cairn::dtype::i64, {7}},
                                 {"c", cairn::dtype::bf16, {}}});
  cairn::stream::stream_settings settings;
  settings.slab_bytes = 40;
  settings.to_dtype = cairn::dtype::f64;  // a: f32 -> f64, c: bf16 -> f64, b stays i64
  std::vector<const cairn::stream::tensor_entry*> ts;
  for (const auto& t : src.tensors()) ts.push_back(&t);
  auto jobs = cairn::stream::detail::plan_jobs(ts, settings);
  std::map<std::string, std::vector<std::byte>> out;
  cairn::stream::stream_stats stats;
  REQUIRE(cairn::stream::detail::pump(src, jobs, settings, stats, nullptr,
                                      [&](const cairn::stream::detail::slab_job& job,
                                          std::span<const std::byte> bytes) -> cairn::result<void> {
                                        CHECK(bytes.size() <= settings.slab_bytes);
                                        auto& o = out[job.t->key];
                                        CHECK(job.out_offset == o.size());  // in order, contiguous
                                        o.insert(o.end(), bytes.begin(), bytes.end());
                                        return cairn::ok();
                                      }));
  CHECK(src.reads > 1);
  CHECK(stats.bytes_read == 10 * 3 * 4 + 7 * 8 + 2);
  CHECK(stats.bytes_written == 10 * 3 * 8 + 7 * 8 + 8);
  CHECK(out.at("b") == src.data_.at("b"));
  std::vector<double> a(30);
  REQUIRE(out.at("a").size() == a.size() * 8);
  std::memcpy(a.data(), out.at("a").data(), out.at("a").size());
  std::vector<float> want(30);
  std::memcpy(want.data(), src.data_.at("a").data(), 120);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == static_cast<double>(want[i]));

  src.fail_key = "b";
  int sunk = 0;
  auto r = cairn::stream::detail::pump(
      src, jobs, settings, stats, nullptr,
      [&](const cairn::stream::detail::slab_job&, std::span<const std::byte>) {
        ++sunk;
        return cairn::result<void>(cairn::ok());
      });
  REQUIRE(!r);
  CHECK(r.err().key == "b");
  CHECK(r.err().code == cairn::errc::io);
}
