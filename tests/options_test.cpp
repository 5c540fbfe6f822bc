// Load options: strict handling modes, key mapping, ignore globs and the key callback.
#include <doctest/doctest.h>

#include <atomic>

#include "tests/support/test_util.hpp"

namespace {

/// Saves {"model.w": [1,2,3,4], "model.b": [5,6], "optim.step": 7} from one rank.
void save_reference(cairn::memory_storage& mem) {
  cairn::single_communicator comm;
  std::vector<float> w{1, 2, 3, 4}, b{5, 6};
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("model.w", std::span(w), {4}, 0));
  sd.add("b", cairn::replicated("model.b", std::span(b), {2}, 0));
  sd.child("optim").add("step", std::int64_t{7});
  cairn::save(sd, mem, comm);
}

/// A target that asks for model.w and an extra key model.extra, but not model.b.
struct target {
  std::vector<float> w = std::vector<float>(4, 0.0f), extra = std::vector<float>(3, -1.0f);
  cairn::state_dict sd;
  target() {
    sd.add("w", cairn::replicated("model.w", std::span(w), {4}, 0));
    sd.add("extra", cairn::replicated("model.extra", std::span(extra), {3}, 0));
    sd.child("optim").add("step", std::int64_t{0});
  }
};

cairn::load_options with(cairn::strict_mode m) {
  cairn::load_options o;
  o.strict = m;
  o.log = [](const std::string&) {};
  return o;
}

}  // namespace

TEST_CASE("strict handling modes") {
  cairn::memory_storage mem;
  save_reference(mem);
  cairn::single_communicator comm;
  using sm = cairn::strict_mode;
  {
    target t;  // default: the unexpected key fails the load
    auto r = cairn::try_load(t.sd, mem, comm);
    REQUIRE(!r);
    CHECK(r.err().key == "model.extra");
  }
  for (sm m : {sm::raise_unexpected, sm::raise_all}) {
    target t;
    auto r = cairn::try_load(t.sd, mem, comm, with(m));
    REQUIRE(!r);
    CHECK(r.err().describe().find("model.extra") != std::string::npos);
    CHECK(t.w[0] == 0.0f);  // nothing read
  }
  for (sm m :
       {sm::log_unexpected, sm::log_all, sm::return_unexpected, sm::return_all, sm::ignore_all}) {
    target t;
    std::vector<std::string> logged;
    auto o = with(m);
    o.log = [&](const std::string& s) { logged.push_back(s); };
    auto stats = cairn::load(t.sd, mem, comm, o);
    CHECK(t.w == std::vector<float>{1, 2, 3, 4});
    CHECK(t.extra == std::vector<float>(3, -1.0f));  // skipped, untouched
    CHECK(stats.unexpected == std::vector<std::string>{"model.extra"});
    bool all = m == sm::log_all || m == sm::return_all;
    CHECK(stats.missing ==
          (all ? std::vector<std::string>{"model.b"} : std::vector<std::string>{}));
    bool logs = m == sm::log_unexpected || m == sm::log_all;
    CHECK(logged.size() == (logs ? (all ? 2u : 1u) : 0u));
  }
  {
    // raise_all also fails on missing keys alone.
    std::vector<float> w(4);
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("model.w", std::span(w), {4}, 0));
    auto r = cairn::try_load(sd, mem, comm, with(sm::raise_all));
    REQUIRE(!r);
    CHECK(r.err().describe().find("model.b") != std::string::npos);
  }
}

TEST_CASE("missing keys are computed across ranks") {
  cairn::memory_storage mem;
  save_reference(mem);
  std::vector<std::vector<std::string>> missing(2);
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(4), b(2);
    cairn::state_dict sd;
    if (comm.rank() == 0)
      sd.add("w", cairn::replicated("model.w", std::span(w), {4}, 0));
    else
      sd.add("b", cairn::replicated("model.b", std::span(b), {2}, 0));
    missing[comm.rank()] = cairn::load(sd, mem, comm, with(cairn::strict_mode::return_all)).missing;
  });
  CHECK(missing[0] == std::vector<std::string>{"optim.step"});
  CHECK(missing[1] == missing[0]);
}

TEST_CASE("key mapping loads a checkpoint saved under old names") {
  cairn::memory_storage mem;
  save_reference(mem);
  cairn::single_communicator comm;
  std::vector<float> w(4);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("decoder.weight", std::span(w), {4}, 0));
  sd.add("steps", std::int64_t{0});
  cairn::load_options o;
  o.key_mapping = {{"decoder.weight", "model.w"}, {"steps", "optim.step"}};
  cairn::load(sd, mem, comm, o);
  CHECK(w == std::vector<float>{1, 2, 3, 4});
  CHECK(std::get<cairn::common_value>(*sd.find("steps")).as<std::int64_t>() == 7);
}

TEST_CASE("ignore globs and the key callback skip leaves") {
  cairn::memory_storage mem;
  save_reference(mem);
  cairn::single_communicator comm;
  {
    target t;
    cairn::load_options o;
    o.ignore_keys = {"model.ex*"};
    cairn::load(t.sd, mem, comm, o);
    CHECK(t.w[3] == 4.0f);
    CHECK(t.extra[0] == -1.0f);
  }
  {
    target t;
    cairn::load_options o;
    o.edit_keys = [](std::vector<std::string>& keys) {
      std::erase(keys, "model.extra");
      std::erase(keys, "model.w");
    };
    cairn::load(t.sd, mem, comm, o);
    CHECK(t.w[0] == 0.0f);  // removed by the callback
    CHECK(std::get<cairn::common_value>(*t.sd.child("optim").find("step")).as<std::int64_t>() == 7);
  }
}

TEST_CASE("per-rank objects on a changed world size: an error naming the key, or object_mapping") {
  using bytes = std::vector<std::byte>;
  auto obj = [](int v, int rank, int world) {
    return cairn::per_rank("rng", bytes(8, static_cast<std::byte>(v)), rank, world);
  };
  auto value_of = [](cairn::state_dict& sd) {
    return static_cast<int>(std::get<cairn::byte_object>(*sd.find("rng")).value.at(0));
  };
  cairn::memory_storage mem;
  cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("rng", obj(100 + comm.rank(), comm.rank(), 4));
    cairn::save(sd, mem, comm);
  });
  // Without a mapping, loading on 3 ranks fails on every rank with the key and the grids.
  std::vector<std::string> errors(3);
  cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("rng", obj(0, comm.rank(), 3));
    auto r = cairn::try_load(sd, mem, comm);
    REQUIRE(!r);
    errors[comm.rank()] = r.err().describe();
    CHECK(r.err().key == "rng");
  });
  for (const auto& e : errors) {
    CHECK(e.find("topology changed") != std::string::npos);
    CHECK(e.find("object_mapping") != std::string::npos);
  }
  // With objects_modulo, rank r of 3 gets what rank r of 4 saved; on 8, rank r gets r mod 4.
  for (int m : {3, 8}) {
    std::vector<int> got(m);
    cairn::run_ranks(m, [&](cairn::thread_communicator& comm) {
      cairn::state_dict sd;
      sd.add("rng", obj(0, comm.rank(), m));
      cairn::load_options lo;
      lo.object_mapping = cairn::objects_modulo();
      cairn::load(sd, mem, comm, lo);
      got[comm.rank()] = value_of(sd);
    });
    for (int r = 0; r < m; ++r) CHECK(got[r] == 100 + r % 4);
  }
  // A mapping that returns nullopt leaves the value alone.
  cairn::single_communicator one;
  cairn::state_dict sd;
  sd.add("rng", obj(7, 0, 1));
  cairn::load_options lo;
  lo.object_mapping = [](const std::string&, const cairn::shape&, const cairn::shape&,
                         const cairn::shape&) -> std::optional<cairn::shape> {
    return std::nullopt;
  };
  cairn::load(sd, mem, one, lo);
  CHECK(value_of(sd) == 7);
}

TEST_CASE("a tensor every rank needs whole is read once and broadcast") {
  cairn::memory_storage mem;
  std::vector<float> w(512 * 256);  // 512 KiB
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  {
    cairn::single_communicator one;
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(w), {512, 256}, 0));
    cairn::save(sd, mem, one);
  }
  for (bool once : {true, false}) {
    CAPTURE(once);
    std::vector<std::uint64_t> read(4);
    std::atomic<int> bad{0};
    cairn::run_ranks(4, [&](cairn::thread_communicator& comm) {
      std::vector<float> got(w.size(), -1.0f);
      cairn::state_dict sd;
      sd.add("w", cairn::replicated("w", std::span(got), {512, 256}, comm.rank()));
      cairn::load_options lo;
      lo.read_once_broadcast = once;
      read[comm.rank()] = cairn::load(sd, mem, comm, lo).bytes_read;
      if (got != w) ++bad;
    });
    CHECK(bad == 0);
    std::uint64_t total = read[0] + read[1] + read[2] + read[3];
    CHECK(total == (once ? 1u : 4u) * w.size() * sizeof(float));
  }
}

TEST_CASE("a foreign layout without its reader in the program fails saying what to include") {
  // This test executable does not include cairn/format/foreign.hpp (tests/convert does). Built
  // with separate compilation, the readers are in libcairn.a, compiled once and registered by
  // it: every program reads every format, and the junk below is a corrupt DCP checkpoint.
  cairn::memory_storage mem;
  std::string junk = "not read";
  mem.put(".metadata", std::as_bytes(std::span(junk))).value();
  cairn::state_dict sd;
  std::vector<float> w(4);
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {4}, {}));
  cairn::single_communicator one;
  auto r = cairn::try_load(sd, mem, one);
  REQUIRE(!r);
#if CAIRN_HEADER_ONLY
  CHECK(r.err().code == cairn::errc::unsupported_version);
  CHECK(r.err().message.find("torch_dist checkpoint") != std::string::npos);
  CHECK(r.err().message.find("cairn/format/foreign.hpp") != std::string::npos);
#else
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().file.find(".metadata") != std::string::npos);
#endif
}

TEST_CASE("preprocess_common drops values that may differ before the cross-rank check") {
  cairn::memory_storage mem;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    cairn::state_dict sd;
    sd.add("step", std::int64_t{5});
    sd.add("hostname", std::string("node") + std::to_string(comm.rank()));
    auto r = cairn::try_save(sd, mem, comm);
    CHECK(!r);
    cairn::save_options o;
    o.preprocess_common = [](std::map<std::string, cairn::common_value>& c) {
      c.erase("hostname");
    };
    cairn::save(sd, mem, comm, o);
  });
  CHECK(cairn::load_common(mem).value().at("hostname").as<std::string>() == "node0");
}
