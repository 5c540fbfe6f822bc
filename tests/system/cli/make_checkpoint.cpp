// Test helper for the CLI tests: `make_checkpoint DIR` saves a small checkpoint from 2 thread
// ranks (`make_checkpoint zstd DIR` compressed, `make_checkpoint index DIR` in format version 4;
// `make_checkpoint manager DIR`: a checkpointer's root with steps 10, 20 and 30, 10 tagged
// "best", and an incomplete step 40);
// `make_checkpoint check-json FILE` exits 0 when FILE is one valid JSON object.
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "check-json") {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    auto err = parser.load(argv[2]).get(doc);
    if (err || !doc.is_object()) {
      std::fprintf(stderr, "not one JSON object: %s\n", simdjson::error_message(err));
      return 1;
    }
    return 0;
  }
  const std::string mode = argc == 3 ? argv[1] : "";
  if (argc != 2 && !(argc == 3 && (mode == "zstd" || mode == "index" || mode == "manager" ||
                                   mode == "changed"))) {
    std::fprintf(stderr,
                 "usage: make_checkpoint DIR | make_checkpoint zstd|index|manager|changed DIR | "
                 "make_checkpoint check-json FILE\n");
    return 2;
  }
  cairn::file_storage disk(argv[argc - 1]);
  if (mode == "manager") {
    cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
      cairn::checkpointer ckpt(disk, comm, {.name = "step_{step:06}"});
      std::vector<float> w(64 * 8);
      cairn::state_dict sd;
      sd.add("model.w",
             cairn::from_rank_offsets("model.w", std::span(w), {64, 8}, {{0, comm.rank(), 2}}));
      for (std::int64_t step : {10, 20, 30}) {
        std::fill(w.begin(), w.end(), static_cast<float>(step));
        std::vector<std::string> tags;
        if (step == 10) tags.push_back("best");
        ckpt.save(sd, {.step = step}, tags);
      }
    });
    const std::string partial = "partial";
    return disk.put("step_000040/data.0.0123456789ab.cairn", std::as_bytes(std::span(partial))) ? 0
                                                                                                : 1;
  }
  cairn::save_options opt;
  if (mode == "zstd") opt.zstd_level = 3;  // the constant tensors compress well
  opt.index_files = mode == "index";
  opt.content_metadata = {{"purpose", "cli test"}};
  opt.block_size = 256;
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    std::vector<float> w(64 * 8, 1.5f + comm.rank());
    std::vector<std::int64_t> ids(10, 7);
    cairn::state_dict sd;
    sd.add("model.w",
           cairn::from_rank_offsets("model.w", std::span(w), {64, 8}, {{0, comm.rank(), 2}}));
    sd.add("model.ids", cairn::replicated("model.ids", std::span(ids), {10}, comm.rank()));
    // "changed": the same tensors, another step and rank 1's RNG state changed.
    const bool changed = mode == "changed";
    sd.add("step", std::int64_t{changed ? 13 : 12});
    const int seed = comm.rank() + (changed && comm.rank() == 1 ? 10 : 0);
    std::vector<std::byte> rng(16, static_cast<std::byte>(seed));
    sd.add("rng", cairn::per_rank("rng", std::move(rng), comm.rank(), comm.size()));
    cairn::save(sd, disk, comm, opt);
  });
  return 0;
}
