// The one doctest implementation TU, shared by every test executable (library cairn_test_main).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
