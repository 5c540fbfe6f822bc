// libtorch (Debian's, built with glog) defines CHECK, CHECK_EQ, ... as glog macros. Include
// this after <torch/torch.h> instead of <doctest/doctest.h>: it drops glog's macros that doctest
// defines too, so CHECK is doctest's.
#pragma once

#include <torch/torch.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT
#include <doctest/doctest.h>
