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

TEST_CASE("torch_dist keeps content_metadata where Megatron does: common.pt's dict") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  so.content_metadata = {{"model", "tiny"}, {"tp", "4"}};
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 1.0f);
    s.step = 77;
    cairn::save(s, mem, comm, so);
  });
  CHECK(cairn::read_content_metadata(mem).value() == so.content_metadata);
  // In common.pt as Megatron's load_content_metadata reads it: common["content_metadata"].
  auto a = cairn::torch_zip::open_archive(mem, "common.pt").value();
  const cairn::pickle::value* cm = a.root.get("content_metadata");
  REQUIRE(cm);
  REQUIRE(cm->is_dict());
  REQUIRE(cm->get("tp"));
  CHECK(cm->get("tp")->str == "4");
  REQUIRE(a.root.get("step"));
  CHECK(a.root.get("step")->i == 77);
  auto m = cairn::read_any_metadata(mem).value();
  CHECK(m.content_metadata == so.content_metadata);
  CHECK(m.inline_commons.count("content_metadata") == 0);  // not a common value of the tree
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    train_state s;
    make_state(s, comm.rank(), 2, 0.0f);
    cairn::load_options lo;
    lo.strict = cairn::strict_mode::raise_all;  // common.pt's values count as saved keys
    cairn::load(s, mem, comm, lo);
    CHECK(s.step == 77);
  });

  // Read without touching a data file (Megatron's load_content_metadata): with every .distcp
  // gone, the content metadata still reads; the whole metadata does not.
  cairn::memory_storage no_data;
  for (const auto& name : mem.list("").value()) {
    if (name.ends_with(".distcp")) continue;
    std::vector<std::byte> b(mem.size(name).value());
    mem.read(name, 0, b).value();
    no_data.put(name, b).value();
  }
  CHECK(cairn::read_content_metadata(no_data).value() == so.content_metadata);
  CHECK_FALSE(cairn::read_any_metadata(no_data));

  // Content metadata alone still writes common.pt.
  cairn::memory_storage bare;
  cairn::run_ranks(1, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(4, 2.0f);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4}, {}));
    cairn::save(sd, bare, comm, so);
  });
  CHECK(cairn::read_content_metadata(bare).value() == so.content_metadata);

  // A common value under Megatron's key and content_metadata: refused, nothing committed.
  cairn::memory_storage clash;
  std::optional<cairn::error> refused;
  cairn::run_ranks(1, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("content_metadata", std::string("mine"));
    if (auto r = cairn::try_save(sd, clash, comm, so); !r) refused = r.err();
  });
  REQUIRE(refused);
  CHECK(refused->code == cairn::errc::invalid_argument);
  CHECK(refused->message.find("content_metadata") != std::string::npos);
  CHECK(!clash.exists(".metadata").value());
}

TEST_CASE("content_metadata Megatron wrote with Python values reads as Python prints them") {
  cairn::memory_storage mem;
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::run_ranks(1, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(4, 2.0f);
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4}, {}));
    cairn::save(sd, mem, comm, so);
  });
  // common.pt as Megatron's training writes it (megatron/training/checkpointing.py).
  using cairn::pickle::value;
  value cm = value::dict(
      {{value::string("singleton_local_shards"), value::boolean(false)},
       {value::string("distrib_optim_sharding_type"), value::string("fully_sharded_model_space")},
       {value::string("chained_optim_avoid_prefix"), value::boolean(true)},
       {value::string("iteration"), value::integer(1200)},
       {value::string("lr"), value::floating(1.0)},
       {value::string("scale"), value::floating(0.25)},
       {value::string("hint"), value::none()},
       {value::string("nested"), value::list({value::integer(1)})}});
  value root = value::dict({{value::string("content_metadata"), cm},
                            {value::string("iteration"), value::integer(1200)}});
  cairn::dcp::detail::buffer_writer buf;
  REQUIRE(cairn::torch_zip::write_archive(buf, 0, "common", root, {}, "common.pt"));
  REQUIRE(mem.put("common.pt", buf.data()));
  const std::map<std::string, std::string> want = {
      {"singleton_local_shards", "False"},
      {"distrib_optim_sharding_type", "fully_sharded_model_space"},
      {"chained_optim_avoid_prefix", "True"},
      {"iteration", "1200"},
      {"lr", "1.0"},
      {"scale", "0.25"},
      {"hint", "None"}};  // the list is no string map value: left out
  CHECK(cairn::read_content_metadata(mem).value() == want);
  CHECK(cairn::read_any_metadata(mem).value().inline_commons.count("iteration") == 1);
}

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
