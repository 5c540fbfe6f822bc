// README.md's example ("## Example"), compiled as printed (snippets/readme_example.inc, extracted
// by this folder's CMakeLists.txt) and run as its last line says: trained and saved on 3 thread
// ranks, then resumed on 4 and on 5. The checkpoint must hold the whole [1024, 512] weight and
// step 1000 (1024 / 3 rows per rank would describe a [1023, 512] tensor, and the resumes fail).
#include "readme_example.inc"

#include <cstdio>
#include <filesystem>

/// The example's state on one rank, the weight whole.
struct whole_state {
  std::vector<float> w = std::vector<float>(1024 * 512, -1.0f);
  cairn::sharded_tensor<float> weight =
      cairn::replicated("model.weight", std::span(w), {1024, 512}, 0);
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("", "model.weight", "step");
};

int main() {
  std::filesystem::remove_all("ckpt");
  for (int ranks : {3, 4, 5}) {
    cairn::run_ranks(ranks, train);  // saves on 3 ranks; resumes (step 1000 already) on 4 and 5
    std::printf("README example ran on %d ranks\n", ranks);
  }
  // The last checkpoint, read whole on one rank: its shape and step as the example describes.
  whole_state s;
  cairn::file_storage last("ckpt/step_001000");
  cairn::single_communicator one;
  cairn::load(s, last, one);
  if (s.step != 1000) {
    std::fprintf(stderr, "FAIL: step %lld, want 1000\n", static_cast<long long>(s.step));
    return 1;
  }
  for (float v : s.w)
    if (v != 0.0f) {
      std::fprintf(stderr, "FAIL: the weight does not hold what the example saved (zeros)\n");
      return 1;
    }
  std::printf("PASS: ckpt/step_001000 holds model.weight [1024, 512] and step 1000\n");
  return 0;
}
