// Fuzz target "pickle": cairn::pickle::load on arbitrary bytes (default load_limits), then a
// recursive walk of the result as a consumer would make one. load promises that such a walk is
// bounded by the size of the input and nests at most load_limits::max_depth (256 by default):
// the walk checks generous bounds of its own (1024 deep; 128 units per input byte plus 4 Mi,
// where load_limits allows about 80 plus 2 Mi), so that this file needs no change when the
// limits are tuned.
#include <cstdint>

#include "cairn/format/torch/pickle.hpp"
#include "tests/system/fuzz/fuzz.hpp"

namespace {

struct walker {
  std::uint64_t units = 0;  // nodes plus string bytes, every shared node counted per use
  std::uint64_t budget = 0;
  static constexpr std::size_t max_depth = 1024;

  void walk(const cairn::pickle::value& v, std::size_t depth) {
    cairn_fuzz::check(depth <= max_depth, "a loaded pickle nests deeper than 1024");
    units += 1 + v.str.size() + v.name.size();
    cairn_fuzz::check(units <= budget, "a loaded pickle expands beyond load_limits");
    if (v.items)
      for (const auto& x : *v.items) walk(x, depth + 1);
    if (v.entries)
      for (const auto& [k, x] : *v.entries) {
        walk(k, depth + 1);
        walk(x, depth + 1);
      }
    if (v.obj) {
      walk(v.obj->args, depth + 1);
      walk(v.obj->state, depth + 1);
      for (const auto& x : v.obj->list_items) walk(x, depth + 1);
      for (const auto& [k, x] : v.obj->dict_items) {
        walk(k, depth + 1);
        walk(x, depth + 1);
      }
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto v = cairn::pickle::load(cairn_fuzz::bytes(data, size), "fuzz.pkl");
  if (!v) return 0;
  walker w;
  w.budget = 128 * std::uint64_t{size} + (std::uint64_t{4} << 20);
  w.walk(*v, 0);
  (void)v->describe();
  return 0;
}
