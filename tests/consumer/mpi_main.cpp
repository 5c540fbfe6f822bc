// Consumer test program for the optional part cairn::mpi: built (not run) against cairn::mpi.
#include <cairn/comm/mpi.hpp>

int main() { return 0; }
