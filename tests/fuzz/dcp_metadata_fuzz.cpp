// Fuzz target "dcp_metadata": PyTorch DCP's .metadata pickle, decoded by dcp::decode (the pickle
// reader, then from_value for torch 1.13 and 2.x layouts). What it accepts and dcp::encode
// writes again (torch 2.x module paths, or torch 1.13's when the input's size is odd) must
// decode again.
#include "cairn/format/dcp/metadata.hpp"
#include "tests/fuzz/fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace dcp = cairn::dcp;
  auto m = dcp::decode(cairn_fuzz::bytes(data, size), "fuzz/.metadata");
  if (!m) return 0;
  auto encoded = dcp::encode(*m, size % 2 ? dcp::flavor::torch1_13 : dcp::flavor::torch2);
  if (!encoded) return 0;  // decode accepts more than encode writes
  auto again = dcp::decode(std::as_bytes(std::span(*encoded)), "fuzz/re-encoded.metadata");
  cairn_fuzz::check(bool(again), "DCP metadata that decoded does not decode after encode");
  return 0;
}
