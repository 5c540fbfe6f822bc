// expect-error: static assertion failed: harness sanity
// Proves the compile-fail harness works: this file must fail to compile with the message above,
// and its CAIRN_SHOULD_COMPILE twin must compile.
#include <cairn/core/dtype.hpp>

#ifndef CAIRN_SHOULD_COMPILE
static_assert(sizeof(int) == 0, "harness sanity");
#endif

static_assert(cairn::dtype_size(cairn::dtype::f32) == 4);
