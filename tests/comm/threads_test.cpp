// tests/comm/threads_test.cpp: what thread ranks add beyond the communicator conformance suite:
// thread_group used directly, run_ranks_collect, misuse detection (mismatched collectives, a rank
// that returns while others wait) and argument checks.
#include "cairn/comm/threads.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cairn/comm/single.hpp"

namespace {

// The errc::comm message rank `r` got from `f`, or "" if `f` did not throw one.
template <class F>
std::string comm_error_of(F&& f) {
  try {
    f();
  } catch (const cairn::exception& e) {
    if (e.err().code == cairn::errc::comm) return e.err().message;
    return "wrong code: " + std::string(e.what());
  }
  return "";
}

}  // namespace

TEST_SUITE("comm thread ranks") {
  TEST_CASE("run_ranks_collect returns each rank's value in rank order") {
    auto got = cairn::run_ranks_collect(4, [](cairn::thread_communicator& c) {
      auto all = c.all_gather(cairn::bytes(static_cast<std::size_t>(c.rank())));
      std::string s;
      for (const auto& b : all) s += std::to_string(b.size());
      return std::to_string(c.rank()) + ":" + s;
    });
    CHECK(got == std::vector<std::string>{"0:0123", "1:0123", "2:0123", "3:0123"});
  }

  TEST_CASE("run_ranks takes lvalue, const and move-only callables") {
    std::atomic<int> calls{0};
    const auto f = [&](cairn::thread_communicator&) { calls.fetch_add(1); };
    cairn::run_ranks(3, f);
    auto p = std::make_unique<int>(5);
    cairn::run_ranks(2, [&, q = std::move(p)](cairn::thread_communicator& c) {
      calls.fetch_add(*q - 4);
      c.barrier();
    });
    CHECK(calls.load() == 5);
  }

  TEST_CASE("a world must have at least one rank") {
    for (int n : {0, -3}) {
      try {
        cairn::run_ranks(n, [](cairn::thread_communicator&) {});
        FAIL_CHECK("no exception for n = " << n);
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::invalid_argument);
      }
    }
    CHECK_THROWS_AS(cairn::thread_group(0), cairn::exception);
    cairn::thread_group g(2);
    CHECK_THROWS_AS(g.comm(2), cairn::exception);
    CHECK_THROWS_AS(g.comm(-1), cairn::exception);
    CHECK(g.comm(1).rank() == 1);
    CHECK(g.comm(1).size() == 2);
  }

  TEST_CASE("thread_group works with the caller's own threads") {
    cairn::thread_group g(3);
    std::vector<std::vector<cairn::bytes>> got(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        auto c = g.comm(r);
        cairn::bytes b(1, std::byte(r));
        c.broadcast(b, 2);
        got[static_cast<std::size_t>(r)] = c.all_gather(b);
        c.barrier();
        g.finish(r);
      });
    }
    for (auto& t : ts) t.join();
    for (const auto& v : got)
      CHECK(v == std::vector<cairn::bytes>(3, cairn::bytes(1, std::byte{2})));
    CHECK_FALSE(g.aborted());
  }

  TEST_CASE("thread_group::abort wakes waiting ranks") {
    cairn::thread_group g(3);
    std::vector<std::string> msgs(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) {
      ts.emplace_back([&, r] {
        msgs[static_cast<std::size_t>(r)] = comm_error_of([&] { g.comm(r).barrier(); });
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g.abort(-1, "operator pressed stop");
    for (auto& t : ts) t.join();
    CHECK(g.aborted());
    CHECK(g.abort_message() == "thread group aborted: operator pressed stop");
    for (const auto& m : msgs) CHECK(m == "thread group aborted: operator pressed stop");
    CHECK(comm_error_of([&] { g.comm(2).barrier(); }) == g.abort_message());  // later entry
  }

  TEST_CASE("mismatched collectives throw on every rank instead of hanging") {
    std::vector<std::string> msgs(3);
    auto run = [&] {
      cairn::run_ranks(3, [&](cairn::thread_communicator& c) {
        msgs[static_cast<std::size_t>(c.rank())] = comm_error_of([&] {
          c.barrier();  // collective #0 matches
          if (c.rank() == 1) {
            cairn::bytes b;
            c.broadcast(b, 0);
          } else {
            (void)c.all_gather({});
          }
        });
      });
    };
    run();  // every rank caught its error, so nothing to rethrow
    for (const auto& m : msgs) {
      CHECK(m.find("collective mismatch at collective #1") != std::string::npos);
      CHECK(m.find("called broadcast(root 0)") != std::string::npos);
      CHECK(m.find("called all_gather") != std::string::npos);
    }
  }

  TEST_CASE("broadcasts from different roots are a mismatch") {
    auto run = [] {
      cairn::run_ranks(2, [](cairn::thread_communicator& c) {
        cairn::bytes b(4);
        c.broadcast(b, c.rank());
      });
    };
    try {
      run();
      FAIL_CHECK("no exception");
    } catch (const cairn::exception& e) {
      CHECK(e.err().code == cairn::errc::comm);
      CHECK(std::string(e.what()).find("collective mismatch") != std::string::npos);
    }
  }

  TEST_CASE("a rank that stalls past the deadline fails every waiting rank, naming it") {
    std::vector<std::string> errors(3);
    std::atomic<int> failed{0};
    cairn::run_ranks(3, std::chrono::milliseconds(1000), [&](cairn::thread_communicator& c) {
      if (c.rank() == 2)  // stalls until the others have given up on it
        while (failed.load() < 2) std::this_thread::yield();
      errors[static_cast<std::size_t>(c.rank())] = comm_error_of([&] { c.barrier(); });
      ++failed;
    });
    for (const auto& e : errors) {
      CHECK(e.find("rank(s) 2 did not arrive at barrier (collective #0) within 1000 ms") !=
            std::string::npos);
      CHECK(e == errors[0]);  // the stalled rank, arriving late, gets the same error
    }
    CHECK(cairn::thread_group(2).deadline() == cairn::default_collective_deadline);
    CHECK_THROWS_AS(cairn::thread_group(2, std::chrono::milliseconds(-1)), cairn::exception);
  }

  TEST_CASE("with no deadline a collective waits as long as it takes") {
    cairn::thread_group g(2, std::chrono::milliseconds(0));
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      g.comm(1).barrier();
    });
    CHECK_NOTHROW(g.comm(0).barrier());
    late.join();
  }

  TEST_CASE("a rank that returns while others wait for it is an error, not a hang") {
    SUBCASE("returns while the others already wait") {
      try {
        cairn::run_ranks(3, [](cairn::thread_communicator& c) {
          if (c.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            return;
          }
          c.barrier();
        });
        FAIL_CHECK("no exception");
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::comm);
        CHECK(e.err().message.find("rank 1 returned while rank") != std::string::npos);
      }
    }
    SUBCASE("the others call a collective after it returned") {
      std::atomic<bool> returned{false};
      try {
        cairn::run_ranks(2, [&](cairn::thread_communicator& c) {
          if (c.rank() == 1) {
            returned = true;
            return;
          }
          while (!returned) std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          (void)c.all_gather({});
        });
        FAIL_CHECK("no exception");
      } catch (const cairn::exception& e) {
        CHECK(e.err().code == cairn::errc::comm);
        CHECK(e.err().message.find("after rank 1 returned") != std::string::npos);
      }
    }
    SUBCASE("ranks that all return without collectives are fine") {
      CHECK_NOTHROW(cairn::run_ranks(4, [](cairn::thread_communicator& c) {
        if (c.rank() % 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }));
    }
  }

  TEST_CASE("single_communicator is rank 0 of 1") {
    cairn::single_communicator c;
    CHECK(c.rank() == 0);
    CHECK(c.size() == 1);
    const cairn::bytes data{std::byte{1}, std::byte{2}};
    CHECK(c.all_gather(data) == std::vector<cairn::bytes>{data});
    cairn::bytes b = data;
    c.broadcast(b, 0);
    CHECK(b == data);
    CHECK_THROWS_AS(c.broadcast(b, 1), cairn::exception);
    c.barrier();
  }
}

namespace {
std::atomic<int> plain_function_calls{0};
void plain_rank_function(cairn::thread_communicator& comm) {
  comm.barrier();
  ++plain_function_calls;
}
}  // namespace

TEST_CASE("run_ranks accepts a plain function") {
  plain_function_calls = 0;
  cairn::run_ranks(3, plain_rank_function);
  CHECK(plain_function_calls == 3);
}

TEST_SUITE("thread_communicator duplicates") {
  TEST_CASE("a duplicate runs collectives on another thread while the original is in use") {
    cairn::run_ranks(3, [&](cairn::thread_communicator& c) {
      std::unique_ptr<cairn::thread_communicator> d = c.duplicate();
      REQUIRE(d);
      CHECK(d->rank() == c.rank());
      CHECK(d->size() == c.size());
      CHECK(&d->group() != &c.group());
      std::vector<cairn::bytes> on_duplicate;
      std::thread other([&] {
        const std::byte mine{static_cast<unsigned char>(10 + d->rank())};
        for (int i = 0; i < 50; ++i) on_duplicate = d->all_gather(std::span(&mine, 1));
      });
      std::vector<cairn::bytes> on_original;
      const std::byte mine{static_cast<unsigned char>(c.rank())};
      for (int i = 0; i < 50; ++i) on_original = c.all_gather(std::span(&mine, 1));
      other.join();
      for (int r = 0; r < 3; ++r) {
        CHECK(on_original[static_cast<std::size_t>(r)] ==
              cairn::bytes{std::byte(static_cast<unsigned char>(r))});
        CHECK(on_duplicate[static_cast<std::size_t>(r)] ==
              cairn::bytes{std::byte(static_cast<unsigned char>(10 + r))});
      }
      // The k-th duplicate of every rank is the same group; the next one is another.
      auto d2 = c.duplicate();
      CHECK(&d2->group() != &d->group());
      d2->barrier();
    });
  }

  TEST_CASE("a duplicate outlives its group and is aborted with it") {
    std::unique_ptr<cairn::thread_communicator> kept;
    std::string error;
    {
      cairn::thread_group g(2);
      std::unique_ptr<cairn::thread_communicator> d0 = g.comm(0).duplicate();
      kept = g.comm(1).duplicate();
      g.abort(0, "injected");
      error = comm_error_of([&] { d0->barrier(); });
    }  // the group goes; the duplicate's group lives on in its handles
    CHECK(error.find("the group it duplicates was aborted") != std::string::npos);
    CHECK(kept->group().aborted());
  }

  TEST_CASE("the comm_ref of a communicator without duplicate() gives none") {
    struct plain {
      cairn::single_communicator inner;
      int rank() const { return 0; }
      int size() const { return 1; }
      std::vector<cairn::bytes> all_gather(std::span<const std::byte> in) {
        return inner.all_gather(in);
      }
      void broadcast(cairn::bytes& b, int root) { inner.broadcast(b, root); }
      void barrier() {}
    } p;
    CHECK(cairn::comm_ref(p).duplicate() == nullptr);
    cairn::single_communicator one;
    std::shared_ptr<cairn::comm_ref> d = cairn::comm_ref(one).duplicate();
    REQUIRE(d);
    CHECK(d->size() == 1);
  }
}
