// Fuzz target "dcp_metadata": PyTorch DCP's .metadata pickle, decoded by dcp::decode (the pickle
// reader, then from_value for torch 1.13 and 2.x layouts). What it accepts and dcp::encode
// writes again (torch 2.x module paths, or torch 1.13's when the input's size is odd) must
// decode again. Its tensors, described as the load sees them (dcp_as_metadata's records:
// one chunk per DCP chunk, each item holding exactly its elements), go through the load
// planner for every rank of worlds of 1, 2 and 3 (tests/system/fuzz/plan_layouts.hpp).
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "tests/system/fuzz/fuzz.hpp"
#include "tests/system/fuzz/plan_layouts.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace dcp = cairn::dcp;
  auto m = dcp::decode(cairn_fuzz::bytes(data, size), "fuzz/.metadata");
  if (!m) return 0;
  cairn::checkpoint_metadata ck;
  ck.block_size = cairn::foreign_read_block;
  for (const auto& [fqn, item] : m->state_dict_metadata) {
    const auto* t = std::get_if<dcp::tensor_meta>(&item);
    if (!t) continue;
    cairn::tensor_record rec;
    rec.type = t->type;
    rec.global_shape = t->size;
    for (const auto& c : t->chunks) {
      cairn::box b{c.offsets, c.sizes};
      const auto nbytes = static_cast<std::uint64_t>(b.volume()) * cairn::dtype_size(t->type);
      rec.chunks.push_back(cairn::chunk_record{b, cairn::extent{0, 0, nbytes, {}}, {}});
    }
    ck.tensors.emplace(fqn, std::move(rec));
  }
  cairn_fuzz::plan_on_ranks(ck);
  auto encoded = dcp::encode(*m, size % 2 ? dcp::flavor::torch1_13 : dcp::flavor::torch2);
  if (!encoded) return 0;  // decode accepts more than encode writes
  auto again = dcp::decode(std::as_bytes(std::span(*encoded)), "fuzz/re-encoded.metadata");
  cairn_fuzz::check(bool(again), "DCP metadata that decoded does not decode after encode");
  return 0;
}
