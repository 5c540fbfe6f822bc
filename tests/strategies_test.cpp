// strategies.hpp: every save strategy (native, torch_dist, one_file, per_tensor, chunks) also
// writes in the background through async_saver, and the result loads on M ranks. What each
// layout holds is in the owning tests of format/<layout>/strategy.hpp; that each saves on N
// ranks and loads back on M element-exactly is tests/format/conformance_test.cpp's.
#include "cairn/strategies.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

TEST_CASE("async_saver writes every strategy in the background, the result loads on M ranks") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy chunks(cairn::safetensors::file_split::chunks, 700);
  for (const cairn::save_strategy* strategy :
       {static_cast<const cairn::save_strategy*>(&torch_dist),
        static_cast<const cairn::save_strategy*>(&chunks)}) {
    INFO(strategy->name());
    cairn::memory_storage mem;
    std::mt19937 rng(11);
    property_case c = random_case(
        rng, {{"a", cairn::dtype::f32, {12, 9}}, {"b", cairn::dtype::bf16, {7, 4}}}, 3, 2);
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(3, [&](cairn::thread_communicator& comm) {
      cairn::async_saver saver;
      rank_state rs;
      build_rank(rs, c.specs, c.save_grids, comm.rank(), 3, true);
      auto h = saver.save(rs.sd, mem, comm, so);
      REQUIRE(h);
      for (auto& b : rs.buffers) std::fill(b.begin(), b.end(), std::byte{0x11});  // staged
      REQUIRE(h->wait());
    });
    CHECK(load_failures_on_threads(mem, c, 2, layout_kind::block).empty());
  }
}
