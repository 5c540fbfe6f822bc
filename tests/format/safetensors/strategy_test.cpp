// safetensors_strategy (format/safetensors/strategy.hpp): tensors only, never over a checkpoint
// in place, and the same bytes for the same state on any number of ranks.
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
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

TEST_CASE("safetensors strategies hold tensors only and never replace a checkpoint in place") {
  cairn::memory_storage mem;
  cairn::safetensors_strategy one(cairn::safetensors::file_split::one_file);
  cairn::save_options so;
  so.strategy = &one;
  cairn::single_communicator comm;
  {
    train_state s;
    make_state(s, 0, 1, 0.0f);
    auto r = cairn::try_save(s, mem, comm, so);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "rng");
    CHECK(mem.list("").value().empty());
  }
  std::vector<float> w(6, 1.5f);
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {}));
  cairn::save(sd, mem, comm, so);
  auto first = mem.list("").value();
  CHECK(first == std::vector<std::string>{"model.safetensors"});
  so.overwrite = true;
  auto r = cairn::try_save(sd, mem, comm, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::already_exists);
  // A different layout never writes over it either.
  cairn::save_options native;
  auto n = cairn::try_save(sd, mem, comm, native);
  REQUIRE(!n);
  CHECK(n.err().code == cairn::errc::already_exists);
}

TEST_CASE("safetensors output is byte-identical for the same state on any number of ranks") {
  std::vector<std::vector<std::byte>> outputs;
  // The last run also asks for index files, a native option the strategy must not trip over
  // (its shards are written by the native writer).
  for (auto [n, index_files] : {std::pair{1, false}, std::pair{3, false}, std::pair{3, true}}) {
    cairn::memory_storage mem;
    cairn::safetensors_strategy chunks(cairn::safetensors::file_split::chunks, 2000);
    cairn::save_options so;
    so.strategy = &chunks;
    so.index_files = index_files;
    std::mt19937 rng(5);
    property_case c = random_case(rng,
                                  {{"a", cairn::dtype::f32, {12, 9}},
                                   {"b/c", cairn::dtype::bf16, {7}},
                                   {"d", cairn::dtype::i64, {6, 5}}},
                                  n, n);
    save_on_threads(mem, c, n, layout_kind::block, so);
    std::vector<std::byte> all;
    for (const auto& f : sorted_names(mem)) {
      auto size = mem.size(f).value();
      std::vector<std::byte> b(size);
      REQUIRE(mem.read(f, 0, b));
      all.insert(all.end(), b.begin(), b.end());
    }
    outputs.push_back(std::move(all));
  }
  CHECK(outputs[0] == outputs[1]);
  CHECK(outputs[0] == outputs[2]);
}
