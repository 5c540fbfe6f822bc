// expect-error: cannot be visited in a state tree
// A struct field of a type cairn cannot visit (a raw pointer) is a compile error that says
// what to do. The CAIRN_SHOULD_COMPILE twin skips the field with an empty name and compiles.
#include "cairn/tree/visit.hpp"

struct handle {
  int fd;
};

struct bad_state {
  cairn::sharded_tensor<float> w;
  handle* h = nullptr;
#ifdef CAIRN_SHOULD_COMPILE
  static constexpr auto fields = cairn::field_names("w", "");
#else
  static constexpr auto fields = cairn::field_names("w", "h");
#endif
};

int main() {
  bad_state s;
  auto leaves = cairn::flatten(s);
  return static_cast<int>(leaves.tensors.size()) - 1;
}
