// Consumer test program for separate compilation: built against cairn::compiled (libcairn.a,
// CAIRN_SEPARATE_COMPILATION), so cairn's headers declare and the library defines. Saves and
// loads a tensor and a common value through cairn.hpp; exits 0 when they come back.
#include <cairn/cairn.hpp>
#include <cstdint>
#include <span>
#include <vector>

#if CAIRN_HEADER_ONLY
#  error "cairn::compiled must define CAIRN_SEPARATE_COMPILATION for its users"
#endif

int main() {
  std::vector<float> w(64);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  std::int64_t step = 7;
  cairn::memory_storage mem;
  cairn::single_communicator one;
  {
    cairn::state_dict sd;
    sd.add("w", cairn::replicated("w", std::span(w), cairn::shape{8, 8}, 0));
    sd.add("step", step);
    cairn::save(sd, mem, one);
  }
  std::vector<float> back(64, -1.0f);
  cairn::state_dict sd;
  sd.add("w", cairn::replicated("w", std::span(back), cairn::shape{8, 8}, 0));
  sd.add("step", std::int64_t{0});
  cairn::load(sd, mem, one);
  return back == w ? 0 : 1;
}
