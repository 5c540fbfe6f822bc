// faulty_storage (storage/fault_injection.hpp): fail_op numbers every operation and hits only the
// k-th, each fault_mode does to each operation what it documents, the counters count what
// reached the backend, and the coarse switches, disarm and outliving writers behave as promised.
#include "cairn/storage/fault_injection.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cairn/storage/memory.hpp"
#include "tests/storage/conformance.hpp"

namespace fault_injection_test {

using faulty = cairn::faulty_storage<cairn::memory_storage>;

// The sites of run_each, in order: one operation of every kind, each independent of the others.
inline const std::vector<std::string> sites = {
    "put mem://p",    "write_at mem://w", "finish mem://w", "read mem://r",       "size mem://r",
    "exists mem://r", "list mem://",      "remove mem://x", "open_writer mem://v"};

// Runs one operation of every kind through `f` (whose backend holds "r" and "x", and `w`, a
// writer from `f`) and returns which succeeded.
inline std::vector<bool> run_each(faulty& f, cairn::object_writer& w) {
  using namespace cairn_storage_test;
  bytes out(4);
  return {f.put("p", pattern(6)).has_value(),
          w.write_at(0, pattern(6)).has_value(),
          w.finish().has_value(),
          f.read("r", 0, out).has_value(),
          f.size("r").has_value(),
          f.exists("r").has_value(),
          f.list("").has_value(),
          f.remove("x").has_value(),
          f.open_writer("v").has_value()};
}

}  // namespace fault_injection_test

TEST_SUITE("faulty_storage") {
  TEST_CASE("fault_mode names are distinct and short") {
    std::set<std::string> names;
    for (auto m : cairn::all_fault_modes) names.insert(cairn::fault_mode_name(m));
    CHECK(names ==
          std::set<std::string>{"corrupt_read", "fail", "fail_partial", "lie_partial", "lost_ack"});
  }

  TEST_CASE("fail_op hits exactly the k-th operation, and which modes report failure") {
    using namespace cairn_storage_test;
    for (auto mode : cairn::all_fault_modes) {
      // The lying and corrupting modes report success everywhere; the others fail every call.
      const bool reports = mode == cairn::fault_mode::fail ||
                           mode == cairn::fault_mode::fail_partial ||
                           mode == cairn::fault_mode::lost_ack;
      for (std::size_t k = 0; k < fault_injection_test::sites.size(); ++k) {
        CAPTURE(cairn::fault_mode_name(mode));
        CAPTURE(k);
        cairn::memory_storage mem;
        require_ok(mem.put("r", pattern(8)));
        require_ok(mem.put("x", pattern(1)));
        fault_injection_test::faulty f{mem};
        auto w = f.open_writer("w");
        REQUIRE(w.has_value());
        const std::uint64_t before = f.ops();
        CHECK(before == 1);
        f.fail_op(k, mode);
        CHECK(!f.fault_fired());
        CHECK(f.fault_site().empty());
        (void)f.describe("p");  // neither describe nor remove_temporaries is an operation
        (void)f.remove_temporaries("");
        std::vector<bool> ok = fault_injection_test::run_each(f, **w);
        CHECK(f.ops() == before + fault_injection_test::sites.size());
        CHECK(f.fault_fired());
        CHECK(f.fault_site() == fault_injection_test::sites[k]);
        for (std::size_t i = 0; i < ok.size(); ++i) {
          CAPTURE(i);
          CHECK(ok[i] == (i != k || !reports));
        }
      }
    }
  }

  TEST_CASE("what each mode leaves behind after a put, a write_at, a finish or a remove") {
    using namespace cairn_storage_test;
    using cairn::fault_mode;
    const bytes data = pattern(10);
    const bytes half(data.begin(), data.begin() + 5);
    const std::optional<bytes> none;
    // After the faulty call: the object's bytes (none: missing).
    struct expect {
      fault_mode mode;
      std::optional<bytes> put, write_at, finish, remove;
    };
    for (const expect& e : {expect{fault_mode::fail, none, bytes{}, none, data},
                            expect{fault_mode::fail_partial, none, half, none, data},
                            expect{fault_mode::lost_ack, data, data, data, none},
                            expect{fault_mode::lie_partial, half, half, none, data},
                            expect{fault_mode::corrupt_read, data, data, data, none}}) {
      CAPTURE(cairn::fault_mode_name(e.mode));
      {
        cairn::memory_storage mem;
        fault_injection_test::faulty f{mem};
        f.fail_op(0, e.mode);
        (void)f.put("o", data);
        CHECK(mem.contents("o") == e.put);
      }
      {
        cairn::memory_storage mem;
        fault_injection_test::faulty f{mem};
        auto w = f.open_writer("o");
        REQUIRE(w.has_value());
        f.fail_op(0, e.mode);
        auto r = (*w)->write_at(0, data);
        if (e.mode == fault_mode::fail_partial) {
          REQUIRE(!r);
          CHECK(r.err().code == cairn::errc::io);
          CHECK(r.err().file == "mem://o");
          CHECK(*r.err().offset == 5);
          CHECK(r.err().message.find("no space left") != std::string::npos);
        }
        require_ok((*w)->finish());
        CHECK(mem.contents("o") == e.write_at);
      }
      {
        cairn::memory_storage mem;
        fault_injection_test::faulty f{mem};
        auto w = f.open_writer("o");
        REQUIRE(w.has_value());
        require_ok((*w)->write_at(0, data));
        f.fail_op(0, e.mode);
        (void)(*w)->finish();
        CHECK(mem.contents("o") == e.finish);
      }
      {
        cairn::memory_storage mem;
        require_ok(mem.put("o", data));
        fault_injection_test::faulty f{mem};
        f.fail_op(0, e.mode);
        (void)f.remove("o");
        CHECK(mem.contents("o") == e.remove);
      }
      {
        cairn::memory_storage mem;
        fault_injection_test::faulty f{mem};
        f.fail_op(0, e.mode);
        auto w = f.open_writer("o");
        const bool opens = e.mode == fault_mode::lie_partial || e.mode == fault_mode::corrupt_read;
        REQUIRE(w.has_value() == opens);
        if (!opens) {
          CHECK(w.err().file == "mem://o");
          CHECK(!mem.exists("o").value());  // the dropped writer published nothing
        }
      }
    }
  }

  TEST_CASE("what each mode does to the bytes a read returns") {
    using namespace cairn_storage_test;
    using cairn::fault_mode;
    cairn::memory_storage mem;
    const bytes data = pattern(16);
    require_ok(mem.put("r", data));
    fault_injection_test::faulty f{mem};
    const bytes want(data.begin() + 2, data.begin() + 10);  // 8 bytes at offset 2
    for (auto mode : cairn::all_fault_modes) {
      CAPTURE(cairn::fault_mode_name(mode));
      bytes out(8, std::byte{0xEE});
      f.fail_op(0, mode);
      auto r = f.read("r", 2, out);
      bytes first(out.begin(), out.begin() + 4), rest(out.begin() + 4, out.end());
      const bytes want_first(want.begin(), want.begin() + 4), untouched(4, std::byte{0xEE});
      switch (mode) {
        case fault_mode::fail:
          REQUIRE(!r);
          CHECK(*r.err().offset == 2);
          CHECK(r.err().file == "mem://r");
          CHECK(out == bytes(8, std::byte{0xEE}));
          break;
        case fault_mode::fail_partial:
          REQUIRE(!r);
          CHECK(*r.err().offset == 6);
          CHECK(first == want_first);
          CHECK(rest == untouched);
          break;
        case fault_mode::lie_partial:
          REQUIRE(r.has_value());
          CHECK(first == want_first);
          CHECK(rest == untouched);
          break;
        case fault_mode::lost_ack:
          REQUIRE(!r);
          CHECK(r.err().code == cairn::errc::io);
          CHECK(out == want);
          break;
        case fault_mode::corrupt_read: {
          REQUIRE(r.has_value());
          bytes flipped = want;
          flipped[4] ^= std::byte{0x10};
          CHECK(out == flipped);
          break;
        }
      }
    }
    // Re-arming forgets where the last fault hit.
    CHECK(f.fault_site() == "read mem://r");
    f.fail_op(1, cairn::fault_mode::fail);
    CHECK(!f.fault_fired());
    CHECK(f.fault_site().empty());
    bytes out(8);
    require_ok(f.read("r", 2, out));  // each fault hit one read only, and this is op 0
    CHECK(out == want);
    CHECK(!f.fault_fired());
  }

  TEST_CASE("counters count what reached the backend and reset without touching ops") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    fault_injection_test::faulty f{mem};
    require_ok(f.put("a", pattern(10)));
    f.fail_op(0, cairn::fault_mode::fail);
    CHECK(!f.put("b", pattern(10)));
    f.fail_op(0, cairn::fault_mode::lost_ack);
    CHECK(!f.put("c", pattern(10)));  // it happened: counted
    CHECK(f.writes() == 2);
    CHECK(f.bytes_written() == 20);
    bytes out(4);
    require_ok(f.read("a", 0, out));
    f.fail_op(0, cairn::fault_mode::fail);
    CHECK(!f.read("a", 0, out));
    f.fail_op(0, cairn::fault_mode::lost_ack);
    CHECK(!f.read("a", 0, out));
    CHECK(!f.read("missing", 0, out));  // the backend's own failure is not a byte read
    CHECK(f.reads() == 3);
    CHECK(f.bytes_read() == 8);
    CHECK(!f.size("nope"));
    const std::uint64_t ops = f.ops();
    CHECK(ops == 8);
    f.reset_counters();
    CHECK(f.writes() + f.reads() + f.bytes_written() + f.bytes_read() == 0);
    CHECK(f.ops() == ops);
  }

  TEST_CASE("fail_after_writes, fail_reads_of and fail_finish, then disarm") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    require_ok(mem.put("y", pattern(4)));
    require_ok(mem.put("y2", pattern(4)));
    fault_injection_test::faulty f{mem};
    f.fail_after_writes(1);
    require_ok(f.put("a", pattern(2)));
    auto w = f.open_writer("w");  // not a write call
    REQUIRE(w.has_value());
    CHECK(!(*w)->write_at(0, pattern(2)));
    CHECK(!f.put("a", pattern(3)));
    f.fail_reads_of("y");
    bytes out(4);
    auto r = f.read("y", 1, std::span(out).first(3));
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::io);
    CHECK(*r.err().offset == 1);
    require_ok(f.read("y2", 0, out));  // exactly that name
    f.fail_finish();
    CHECK(!(*w)->finish());
    CHECK(!mem.exists("w").value());
    f.fail_finish(false);
    require_ok((*w)->finish());  // the failed finish did not finish the backend's writer
    CHECK(mem.exists("w").value());

    f.fail_after_writes(0);
    f.fail_reads_of("y2");
    f.fail_finish();
    f.fail_op(0, cairn::fault_mode::fail);
    f.disarm();
    require_ok(f.put("a", pattern(5)));
    require_ok(f.read("y", 0, out));
    require_ok(f.read("y2", 0, out));
    auto w2 = f.open_writer("w2");
    REQUIRE(w2.has_value());
    require_ok((*w2)->finish());
    CHECK(!f.fault_fired());
  }

  TEST_CASE("writers outlive the decorator and keep reporting to its counters' state") {
    using namespace cairn_storage_test;
    cairn::memory_storage mem;
    std::unique_ptr<cairn::object_writer> w;
    {
      fault_injection_test::faulty f{mem};
      auto r = f.open_writer("late");
      REQUIRE(r.has_value());
      w = std::move(r).value();
      f.fail_op(1, cairn::fault_mode::fail);  // the finish below
      CHECK(f.features() == cairn::memory_storage::features);
      CHECK(&f.inner() == &mem);
    }
    require_ok(w->write_at(0, pattern(3)));
    auto fin = w->finish();
    REQUIRE(!fin);
    CHECK(fin.err().message.find("injected failure: finish mem://late") != std::string::npos);
    CHECK(!mem.exists("late").value());
  }
}
