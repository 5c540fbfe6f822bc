// tests/comm/conformance_test.cpp: the communicator conformance suite (conformance.hpp) run over
// single_communicator and thread ranks with 1, 2, 3, 4 and 8 ranks, directly and through
// comm_ref; then what thread ranks promise when a rank fails.
#include "tests/comm/conformance.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "cairn/comm/single.hpp"
#include "cairn/comm/threads.hpp"

namespace {

// A world runs `f(comm)` on each of its `n` ranks, SPMD.
struct single_world {
  static constexpr int n = 1;
  template <class F>
  static void spmd(F&& f) {
    cairn::single_communicator c;
    f(c);
  }
};

template <int N>
struct thread_world {
  static constexpr int n = N;
  template <class F>
  static void spmd(F&& f) {
    cairn::run_ranks(N, f);
  }
};

}  // namespace

TYPE_TO_STRING(single_world);
TYPE_TO_STRING(thread_world<1>);
TYPE_TO_STRING(thread_world<2>);
TYPE_TO_STRING(thread_world<3>);
TYPE_TO_STRING(thread_world<4>);
TYPE_TO_STRING(thread_world<8>);

#define CAIRN_COMM_WORLDS \
  single_world, thread_world<1>, thread_world<2>, thread_world<3>, thread_world<4>, thread_world<8>

namespace conf = cairn::conformance;

TEST_SUITE("comm conformance") {
  TEST_CASE_TEMPLATE("rank and size", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::rank_and_size(x, W::n); });
    });
  }

  TEST_CASE_TEMPLATE("all_gather of variable-size payloads", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::all_gather_variable_sizes(x); });
    });
  }

  TEST_CASE_TEMPLATE("gather to every root", W, CAIRN_COMM_WORLDS) {
    W::spmd(
        [](auto& c) { conf::run_with_fallback(c, [](auto& x) { conf::gather_every_root(x); }); });
  }

  TEST_CASE_TEMPLATE("all_to_all of variable-size messages", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) {
      conf::run_with_fallback(c, [](auto& x) { conf::all_to_all_variable_sizes(x); });
    });
  }

  TEST_CASE_TEMPLATE("broadcast from every root", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::broadcast_every_root(x); });
    });
  }

  TEST_CASE_TEMPLATE("barrier orders", W, CAIRN_COMM_WORLDS) {
    std::atomic<int> direct{0};
    std::atomic<int> via_ref{0};
    W::spmd([&](auto& c) {
      conf::barrier_orders(c, &direct);
      cairn::comm_ref ref(c);
      conf::barrier_orders(ref, &via_ref);
    });
  }

  TEST_CASE_TEMPLATE("1000 back-to-back mixed collectives", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) {
      conf::run_direct_and_ref(c, [](auto& x) { conf::mixed_back_to_back(x, 1000); });
    });
  }

  TEST_CASE_TEMPLATE("broadcast with a bad root throws invalid_argument", W, CAIRN_COMM_WORLDS) {
    W::spmd([](auto& c) { conf::bad_root_throws(c); });
    W::spmd([](auto& c) {
      cairn::comm_ref ref(c);
      conf::bad_root_throws(ref);
    });
  }
}

// ---- thread ranks: a failing rank becomes an error everywhere, never a hang ----------------

namespace {

// Runs `collective` on every rank but `failing`, which throws std::runtime_error("boom") after
// `delay` (so that the others are already waiting, or not yet there). Each other rank must get
// errc::comm naming the failed rank; run_ranks must rethrow "boom".
template <class Collective>
void check_failure_propagates(int n,
                              int failing,
                              std::chrono::milliseconds delay,
                              Collective collective) {
  std::atomic<int> comm_errors{0};
  std::atomic<int> wrong{0};
  auto run = [&] {
    cairn::run_ranks(n, [&](cairn::thread_communicator& c) {
      if (c.rank() == failing) {
        std::this_thread::sleep_for(delay);
        throw std::runtime_error("boom");
      }
      try {
        collective(c);
        wrong.fetch_add(1);  // the collective must not complete
      } catch (const cairn::exception& e) {
        const auto& err = e.err();
        const std::string expected = "rank " + std::to_string(failing) + " failed: boom";
        if (err.code == cairn::errc::comm && err.message == expected && err.rank == c.rank()) {
          comm_errors.fetch_add(1);
        } else {
          wrong.fetch_add(1);
        }
        throw;  // a consequence: run_ranks must still rethrow the cause
      }
    });
  };
  CHECK_THROWS_WITH_AS(run(), "boom", std::runtime_error);
  CHECK(comm_errors.load() == n - 1);
  CHECK(wrong.load() == 0);
}

}  // namespace

TEST_SUITE("comm thread ranks failure") {
  TEST_CASE("a rank that throws makes the others' collectives throw errc::comm") {
    using namespace std::chrono_literals;
    for (int n : {1, 2, 3, 4, 8}) {
      for (int failing : {0, n - 1}) {
        for (auto delay : {0ms, 20ms}) {
          CAPTURE(n);
          CAPTURE(failing);
          CAPTURE(delay.count());
          check_failure_propagates(n, failing, delay, [](auto& c) { c.barrier(); });
          check_failure_propagates(n, failing, delay, [](auto& c) {
            cairn::bytes b(static_cast<std::size_t>(c.rank()));
            (void)c.all_gather(b);
          });
          check_failure_propagates(n, failing, delay, [&](auto& c) {
            cairn::bytes b(3);
            c.broadcast(b, failing);  // the root itself is the one that failed
          });
          check_failure_propagates(n, failing, delay, [](auto& c) {
            cairn::comm_ref ref(c);
            for (int i = 0; i < 100; ++i) ref.barrier();  // through comm_ref, many calls
          });
        }
      }
    }
  }

  TEST_CASE("a rank failing after some collectives, later calls on the others throw too") {
    std::atomic<int> comm_errors{0};
    auto run = [&] {
      cairn::run_ranks(4, [&](cairn::thread_communicator& c) {
        for (int i = 0; i < 10; ++i) (void)c.all_gather(cairn::bytes(static_cast<std::size_t>(i)));
        if (c.rank() == 2) throw std::logic_error("rank two gave up");
        for (int attempt = 0; attempt < 3; ++attempt) {  // every later call throws, not just one
          try {
            c.barrier();
          } catch (const cairn::exception& e) {
            if (e.err().code == cairn::errc::comm &&
                e.err().message == "rank 2 failed: rank two gave up") {
              comm_errors.fetch_add(1);
            }
          }
        }
      });
    };
    CHECK_THROWS_WITH_AS(run(), "rank two gave up", std::logic_error);
    CHECK(comm_errors.load() == 3 * 3);
  }

  TEST_CASE("run_ranks rethrows the lowest failing rank's exception, after joining all") {
    std::atomic<int> finished{0};
    auto run = [&] {
      cairn::run_ranks(5, [&](cairn::thread_communicator& c) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5 * (5 - c.rank())));
        finished.fetch_add(1);
        if (c.rank() == 1 || c.rank() == 3) {
          throw std::runtime_error("fail " + std::to_string(c.rank()));
        }
      });
    };
    CHECK_THROWS_WITH_AS(run(), "fail 1", std::runtime_error);
    CHECK(finished.load() == 5);
  }

  TEST_CASE("the cause is rethrown even when a lower rank only saw the abort") {
    auto run = [] {
      cairn::run_ranks(3, [](cairn::thread_communicator& c) {
        if (c.rank() == 2) throw std::out_of_range("index 7");
        c.barrier();  // ranks 0 and 1 throw errc::comm here
      });
    };
    CHECK_THROWS_WITH_AS(run(), "index 7", std::out_of_range);
  }
}
