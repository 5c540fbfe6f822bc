// Linked into cairn-cli-rawdir, a copy of the cairn tool: registers the test-only format rawdir
// (tests/format/rawdir/driver.hpp) by including it, and nothing else. rawdir_test.sh runs it.
#include "tests/format/rawdir/driver.hpp"
