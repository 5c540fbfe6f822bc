// The one doctest implementation TU, shared by every test executable (library cairn_test_main).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

// ctest learns the test names from `--list-test-cases` (doctest_discover_tests) and splits them
// at ';' (CMake's list separator): a case named "a; b" becomes two tests that match nothing and
// pass without running a line. Such a name is refused here, before anything runs, so that the
// executable fails (its discovery and every run) until the case is renamed.
int main(int argc, char** argv) {
  int bad = 0;
  for (const auto& tc : doctest::detail::getRegisteredTests()) {
    if (std::strchr(tc.m_name, ';') != nullptr) {
      std::fprintf(stderr, "%s:%d: test case \"%s\": ';' in a test case name hides it from ctest\n",
                   tc.m_file.c_str(), tc.m_line, tc.m_name);
      ++bad;
    }
  }
  if (bad != 0) return 1;
  doctest::Context context(argc, argv);
  return context.run();
}
