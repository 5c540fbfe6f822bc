// tests/support/source_check.hpp: what every `stream::source` must do, checked on a small
// checkpoint: "w" f32 [6, 4] split by rows over 2 ranks, "ids" i64 [5] replicated, a common
// value and a per-rank object. Listing, boxes of every kind, batches, rows, and the errors of
// unknown keys, bad boxes and wrong buffers; and `memory_source`, a source over whole tensors in
// memory.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/stream/source.hpp"
#include "tests/support/test_util.hpp"

namespace cairn_test {

/// "w" f32 [6, 4] split by rows over 2 ranks, "ids" i64 [5] on rank 0, "step" common, "rng"
/// object per rank: saved with `strategy` (native when null).
inline void save_source_sample(cairn::storage_ref st,
                               const cairn::save_strategy* strategy = nullptr) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::byte> w(3 * 4 * 4), ids(5 * 8);
    fill_block("w", cairn::dtype::f32, {6, 4}, cairn::box{{3 * r, 0}, {3, 4}}, w.data());
    fill_block("ids", cairn::dtype::i64, {5}, cairn::box{{0}, {5}}, ids.data());
    cairn::state_dict sd;
    cairn::sharded_tensor<> tw;
    tw.key = "w";
    tw.type = cairn::dtype::f32;
    tw.local_shape = {3, 4};
    tw.global_shape = {6, 4};
    tw.global_offset = {3 * r, 0};
    tw.data = w;
    sd.add("w", tw);
    cairn::sharded_tensor<> ti;
    ti.key = "ids";
    ti.type = cairn::dtype::i64;
    ti.local_shape = {5};
    ti.global_shape = {5};
    ti.global_offset = {0};
    ti.replica_id = r;
    ti.data = ids;
    sd.add("ids", ti);
    sd.add("step", std::int64_t{42});
    sd.add("rng", cairn::per_rank("rng", std::vector<std::byte>(4, std::byte{7}), r, 2));
    cairn::save(sd, st, comm, {.strategy = strategy});
  });
}

/// The expected bytes of `region` of tensor `key` (`type`, `global`).
inline std::vector<std::byte> source_box(const std::string& key,
                                         cairn::dtype type,
                                         const cairn::shape& global,
                                         const cairn::box& region) {
  std::vector<std::byte> out(static_cast<std::size_t>(region.volume()) * cairn::dtype_size(type));
  fill_block(key, type, global, region, out.data());
  return out;
}

/// Reads boxes of every kind from `src` and checks them against the saved values.
inline void check_reads(cairn::stream::source& src) {
  using cairn::dtype;
  REQUIRE(src.tensors().size() == 2);
  CHECK(src.tensors()[0].key == "ids");  // sorted by key
  CHECK(src.tensors()[1].key == "w");
  const auto* w = src.find("w");
  REQUIRE(w);
  CHECK(w->type == dtype::f32);
  CHECK(w->global_shape == cairn::shape{6, 4});
  CHECK(w->nbytes() == 96);
  CHECK(src.find("v") == nullptr);
  CHECK(src.find("w2") == nullptr);

  // A cairn::box across both ranks' rows, and two boxes of one tensor in one batch.
  cairn::box across{{2, 1}, {2, 2}};
  std::vector<std::byte> a(16), b(8), c(5 * 8);
  REQUIRE(src.read_box("w", across, a));
  CHECK(a == source_box("w", dtype::f32, {6, 4}, across));
  cairn::box last{{5, 2}, {1, 2}};
  cairn::box all_ids{{0}, {5}};
  std::vector<std::byte> empty;
  REQUIRE(
      src.read({{"w", last, b}, {"ids", all_ids, c}, {"w", cairn::box{{0, 0}, {0, 4}}, empty}}));
  CHECK(b == source_box("w", dtype::f32, {6, 4}, last));
  CHECK(c == source_box("ids", dtype::i64, {5}, all_ids));
  std::vector<std::byte> rows(2 * 4 * 4);
  REQUIRE(src.read_rows("w", 4, 6, rows));
  CHECK(rows == source_box("w", dtype::f32, {6, 4}, cairn::box{{4, 0}, {2, 4}}));
}

/// Every request error of `src`, by code and key.
inline void check_request_errors(cairn::stream::source& src) {
  std::vector<std::byte> buf(16);
  auto none = src.read_box("nope", cairn::box{{0}, {1}}, buf);
  REQUIRE(!none);
  CHECK(none.err().code == cairn::errc::not_found);
  CHECK(none.err().key == "nope");
  CHECK(src.read_rows("nope", 0, 1, buf).err().code == cairn::errc::not_found);
  const std::int64_t big = std::int64_t{1} << 62;
  for (const cairn::box& bad :
       {cairn::box{{0}, {4, 1}}, cairn::box{{5, 0}, {2, 4}}, cairn::box{{-1, 0}, {1, 4}},
        cairn::box{{0, 0}, {1, -4}}, cairn::box{{big, 0}, {big + 1, 4}},
        cairn::box{{0, 1}, {1, std::numeric_limits<std::int64_t>::max()}}}) {
    INFO(bad.str());
    auto r = src.read_box("w", bad, buf);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "w");
  }
  auto short_buf = src.read_box("w", cairn::box{{0, 0}, {1, 4}}, std::span(buf).first(15));
  REQUIRE(!short_buf);
  CHECK(short_buf.err().message.find("15 bytes") != std::string::npos);
  CHECK(!src.read_rows("w", 3, 2, buf));  // end before begin
}

/// A source over whole tensors in memory, counting its reads; `fail_key` fails every read of it.
class memory_source final : public cairn::stream::source {
 public:
  explicit memory_source(std::vector<cairn::stream::tensor_entry> ts) : ts_(std::move(ts)) {
    std::sort(ts_.begin(), ts_.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    for (const auto& t : ts_) {
      auto& d = data_[t.key];
      d.resize(t.nbytes());
      fill_block(t.key, t.type, t.global_shape,
                 cairn::box{cairn::shape(t.global_shape.size(), 0), t.global_shape}, d.data());
    }
  }
  std::string_view kind() const noexcept override { return "memory"; }
  const std::vector<cairn::stream::tensor_entry>& tensors() const noexcept override { return ts_; }
  cairn::result<void> read(const std::vector<cairn::stream::box_read>& reqs) override {
    ++reads;
    for (const auto& r : reqs) {
      const auto* t = find(r.key);
      CAIRN_TRY(cairn::stream::detail::check_request(t, r));
      if (r.key == fail_key) return cairn::make_error(cairn::errc::io, "disk gone").with_key(r.key);
      fill_block(t->key, t->type, t->global_shape, r.region, r.out.data());
    }
    return cairn::ok();
  }
  int reads = 0;
  std::string fail_key;
  std::map<std::string, std::vector<std::byte>> data_;

 private:
  std::vector<cairn::stream::tensor_entry> ts_;
};

}  // namespace cairn_test
