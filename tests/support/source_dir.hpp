// Where the repository is, for tests that read committed files or start scripts beside them.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace cairn_test {

/// The repository root, from the environment variable CAIRN_SOURCE_DIR that ctest sets for every
/// test (tests/CMakeLists.txt). It is not compiled in, so that the object files of two clones are
/// the same and ccache shares them.
inline std::string source_dir() {
  const char* dir = std::getenv("CAIRN_SOURCE_DIR");
  if (dir == nullptr || *dir == '\0')
    throw std::runtime_error(
        "CAIRN_SOURCE_DIR is not set: run the test through ctest, or set it to the repository "
        "root");
  return dir;
}

}  // namespace cairn_test
