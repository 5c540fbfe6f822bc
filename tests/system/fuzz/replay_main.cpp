// The main of the fuzz targets in builds without libFuzzer: runs every file named on the command
// line, or found (recursively) in a folder named there, through LLVMFuzzerTestOneInput, in
// sorted order. A missing folder is skipped (a target may have no reproducers yet). Exits 1 when
// no input was found at all, so a wrong path cannot pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/system/fuzz/fuzz.hpp"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      inputs.push_back(p);
    } else {
      std::printf("replay: %s: not found, skipped\n", argv[i]);
    }
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Printed first: when an input crashes, the last line names it.
    std::printf("replay: %s (%zu bytes)\n", p.c_str(), buf.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(buf.data()), buf.size());
  }
  std::printf("replay: %zu input(s) passed\n", inputs.size());
  return inputs.empty() ? 1 : 0;
}
