// expect-error: must list exactly one name per struct field
// field_names must name every field of the struct, in order.
#include "cairn/tree/visit.hpp"

struct state {
  std::int64_t step = 0;
  double lr = 0;
#ifdef CAIRN_SHOULD_COMPILE
  static constexpr auto fields = cairn::field_names("step", "lr");
#else
  static constexpr auto fields = cairn::field_names("step");
#endif
};

int main() {
  state s;
  return static_cast<int>(cairn::flatten(s).commons.size()) - 2;
}
