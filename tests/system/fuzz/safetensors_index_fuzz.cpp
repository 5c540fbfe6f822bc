// Fuzz target "safetensors_index": Hugging Face's model.safetensors.index.json, decoded by
// safetensors::index_from_json. What it accepts must survive to_json and decode to the same
// index.
#include <string>

#include "cairn/format/safetensors/file.hpp"
#include "tests/system/fuzz/fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace sft = cairn::safetensors;
  auto ix = sft::index_from_json(cairn_fuzz::text(data, size), "fuzz/index.json");
  if (!ix) return 0;
  const std::string encoded = sft::to_json(*ix);
  auto again = sft::index_from_json(encoded, "fuzz/re-encoded.json");
  cairn_fuzz::check(bool(again), "an index that decoded does not decode after to_json");
  cairn_fuzz::check(again->weight_map == ix->weight_map && again->total_size == ix->total_size &&
                        again->extra_metadata == ix->extra_metadata,
                    "an index changes across to_json and index_from_json");
  return 0;
}
