// verify_any (format/registry.hpp): native checkpoints by their checksums; DCP and safetensors
// by their layout, bounds and every byte read.
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

TEST_CASE("verify_any: checksums for native, layout and every byte for DCP and safetensors") {
  const cairn::torch_dist_strategy torch_dist;
  const cairn::safetensors_strategy one_file(cairn::safetensors::file_split::one_file);
  const std::pair<const char*, const cairn::save_strategy*> cases[] = {
      {"cairn", nullptr}, {"torch_dist", &torch_dist}, {"safetensors", &one_file}};
  for (auto [format, strategy] : cases) {
    CAPTURE(format);
    cairn::memory_storage mem;
    cairn::save_options so;
    so.strategy = strategy;
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      std::vector<std::int64_t> buf;
      cairn::state_dict sd;
      sd.add("c", counters(buf, 64, comm.rank(), 2));
      cairn::save(sd, mem, comm, so);
    });
    auto report = cairn::verify_any(mem).value();
    CHECK(report.format == format);
    CHECK(report.checksummed == (strategy == nullptr));
    CHECK(report.problems.empty());
    // Cut the last 8 bytes off the largest data file: every layout finds it.
    std::string biggest;
    std::uint64_t most = 0;
    for (const auto& n : mem.list("").value()) {
      const std::uint64_t size = mem.size(n).value();
      const bool data =
          n.ends_with(".distcp") || n.ends_with(".safetensors") || n.starts_with("data.");
      if (data && size > most) most = size, biggest = n;
    }
    REQUIRE(!biggest.empty());
    std::vector<std::byte> bytes(most - 8);
    REQUIRE(mem.read(biggest, 0, bytes));
    REQUIRE(mem.put(biggest, bytes));
    auto cut = cairn::verify_any(mem);
    if (cut) {
      REQUIRE(!cut->problems.empty());
      CHECK(cut->problems.front().err.file.find(biggest) != std::string::npos);
    } else {
      CHECK(cut.err().code == cairn::errc::corrupt);  // safetensors: its reader refuses it
    }
  }
}
