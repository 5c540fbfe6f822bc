// One-file compile-time probe: a save and a load of a small state through cairn.hpp.
#include "cairn/cairn.hpp"
int main() {
  std::vector<float> w(64);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(w), cairn::shape{8, 8}, 0));
  cairn::memory_storage mem;
  cairn::single_communicator one;
  cairn::save(sd, mem, one);
  cairn::load(sd, mem, one);
}
