// Consumer test program: built by tests/consumer/{find_package,add_subdirectory}/ against cairn
// as a user would get it. Exits 0 when the headers are found and usable.
#include <cairn/core/dtype.hpp>
#include <cairn/core/error.hpp>

int main() { return cairn::dtype_size(cairn::dtype::f32) == 4 ? 0 : 1; }
