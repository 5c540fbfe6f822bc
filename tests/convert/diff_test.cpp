// convert::diff (convert/diff.hpp): tensors added, removed, retyped, reshaped and changed,
// between checkpoints of any layout.
#include "cairn/convert/diff.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

TEST_CASE("diff: added, removed, retyped, reshaped and changed tensors, across layouts") {
  auto save = [](cairn::memory_storage& mem, const cairn::save_strategy* strategy, float bump,
                 bool variant) {
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<float> w(32 * 8);
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(comm.rank() * 1000 + static_cast<int>(i));
      if (comm.rank() == 1) w[5] += bump;  // one element of rank 1's rows
      std::vector<std::int32_t> ids(10, 7);
      std::vector<double> wide(6, 1.0);
      cairn::state_dict sd;
      sd.add("w", cairn::from_rank_offsets("w", std::span(w), {32, 8}, {{0, comm.rank(), 2}}));
      sd.add("ids", cairn::replicated("ids", std::span(ids), {10}, comm.rank()));
      if (variant) {
        std::vector<float> narrow(6, 1.0f);
        sd.add("wide", cairn::replicated("wide", std::span(narrow), {6}, comm.rank()));
        std::vector<std::int32_t> more(12, 1);
        sd.add("more", cairn::replicated("more", std::span(more), {12}, comm.rank()));
        cairn::save(sd, mem, comm, so);
      } else {
        sd.add("wide", cairn::replicated("wide", std::span(wide), {6}, comm.rank()));
        std::vector<std::int32_t> gone(3, 1);
        sd.add("gone", cairn::replicated("gone", std::span(gone), {3}, comm.rank()));
        cairn::save(sd, mem, comm, so);
      }
    });
  };
  const cairn::torch_dist_strategy torch_dist;
  cairn::memory_storage a, same_dcp, b;
  save(a, nullptr, 0.0f, false);
  save(same_dcp, &torch_dist, 0.0f, false);
  save(b, nullptr, 0.25f, true);
  auto src_a = cairn::convert::open_source(a).value();
  auto src_same = cairn::convert::open_source(same_dcp).value();
  auto src_b = cairn::convert::open_source(b).value();
  // The same tensors in two layouts: no difference, read in slabs of 64 bytes.
  auto none = cairn::convert::diff(*src_a, *src_same, 64).value();
  CHECK(none.same());
  CHECK(none.compared == 4);
  CHECK(none.bytes_compared == 64 * 8 * 4 + 10 * 4 + 6 * 8 + 3 * 4);  // w is [64, 8]
  auto d = cairn::convert::diff(*src_a, *src_b, 64).value();
  using change = cairn::convert::tensor_diff::change;
  REQUIRE(d.tensors.size() == 4);
  CHECK(d.tensors[0].key == "gone");
  CHECK(d.tensors[0].what == change::removed);
  CHECK(d.tensors[1].key == "more");
  CHECK(d.tensors[1].what == change::added);
  CHECK(d.tensors[1].shape_b == cairn::shape{12});
  CHECK(d.tensors[2].key == "w");
  CHECK(d.tensors[2].what == change::values);
  CHECK(d.tensors[2].differing == 1);
  CHECK(d.tensors[2].max_abs == doctest::Approx(0.25).epsilon(1e-3));
  CHECK(d.tensors[3].key == "wide");
  CHECK(d.tensors[3].what == change::dtype);
  CHECK(d.tensors[3].type_a == cairn::dtype::f64);
  CHECK(d.tensors[3].type_b == cairn::dtype::f32);
  CHECK(d.compared == 2);  // ids and w
}
