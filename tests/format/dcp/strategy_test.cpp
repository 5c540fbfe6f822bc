// torch_dist_strategy (format/dcp/strategy.hpp): common values and sharded objects as DCP items,
// values that do not fit the target dtype, and never over a committed checkpoint.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/message_check.hpp"
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

TEST_CASE("torch_dist keeps common values and sharded objects, a DCP item holds each") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 4, 1.0f);
    s.step = 123;
    s.lr = 0.25f;
    s.warm = true;
    s.run = "run-β";
    s.sched = {3, -4};
    cairn::save(s, mem, comm, so);
  });
  CHECK(mem.exists("common.pt").value());
  CHECK(mem.exists(".metadata").value());
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.format == "torch_dist");
  CHECK(m.objects.size() == 4);
  CHECK(m.inline_commons.at("step").type == cairn::dtype::i64);  // Python int in common.pt
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 0.0f);
    s.rng = cairn::per_rank("rng", rng_state{}, comm.rank(), 4);  // the saved grid
    cairn::load(s, mem, comm);
    CHECK(s.step == 123);
    CHECK(s.lr == 0.25f);
    CHECK(s.warm);
    CHECK(s.run == "run-β");
    CHECK(s.sched == std::vector<std::int64_t>{3, -4});
    CHECK(s.rng.value.s[0] == 7u + static_cast<std::uint64_t>(comm.rank()));
    for (int row = 0; row < 6; ++row)
      for (int col = 0; col < 5; ++col) {
        int grow = comm.rank() * 6 + row;
        int saved_rank = grow / 3, local = (grow % 3) * 5 + col;
        CHECK(s.w_data[row * 5 + col] == 1.0f + static_cast<float>(saved_rank * 100 + local));
      }
  });
}

namespace {
struct wide_state {
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("step");
};
struct narrow_state {
  std::int32_t step = 0;
  static constexpr auto fields = cairn::field_names("step");
};
}  // namespace

TEST_CASE("a Python value that does not fit the target's dtype fails naming the key") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::single_communicator one;
  wide_state w;
  w.step = std::int64_t{1} << 40;
  cairn::save(w, mem, one, so);
  narrow_state n;
  auto r = cairn::try_load(n, mem, one);
  REQUIRE(!r);
  CHECK(r.err().key == "step");
  CHECK(r.err().code == cairn::errc::mismatch);
  w.step = 77;                  // fits: loaded as int32
  cairn::memory_storage fresh;  // torch_dist never replaces a checkpoint in place
  cairn::save(w, fresh, one, so);
  cairn::load(n, fresh, one);
  CHECK(n.step == 77);
}

TEST_CASE("torch_dist never writes over a committed checkpoint, a failed save leaves nothing") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 1.0f);
    cairn::save(s, mem, comm, so);
  });
  auto before = sorted_names(mem);
  // common.pt has a fixed name: replacing it before the commit would change the committed
  // checkpoint, so overwrite is refused before anything is written.
  so.overwrite = true;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 5.0f);
    auto r = cairn::try_save(s, mem, comm, so);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::already_exists);
  });
  CHECK(sorted_names(mem) == before);
  // A save into a fresh place that fails at any write leaves nothing behind.
  for (std::uint64_t k = 0; k < 8; ++k) {
    cairn::memory_storage other;
    cairn::faulty_storage faulty(other);
    faulty.fail_after_writes(k);
    bool ok = true;
    std::mutex mu;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      train_state s;
      make_state(s, comm.rank(), 2, 5.0f);
      auto r = cairn::try_save(s, faulty, comm, so);
      std::lock_guard lock(mu);
      ok = ok && r.has_value();
    });
    if (ok) break;  // k was past the last write
    INFO("failing write " << k);
    CHECK(sorted_names(other).empty());
  }
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(4 * 5);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4, 5}, {{0, comm.rank(), 3}}));
    cairn::load(sd, mem, comm);
    CHECK(w[0] ==
          1.0f + static_cast<float>((comm.rank() * 4 / 6) * 100 + (comm.rank() * 4 % 6) * 5));
  });
}

TEST_CASE("the DCP strategy's write report round-trips and refuses truncation") {
  cairn_test::check_message(cairn::detail::dcp_write_report{{{0, 1024}, {1024, 64}}});
}
