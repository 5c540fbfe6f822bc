// Fuzz target "metadata": the native format's metadata.json decoder, cairn::metadata_from_json
// (allow_unverified when the input's size is odd), on the input as it is (its
// metadata_checksum, when present, rejects almost every mutation) and resealed with a correct
// checksum (reseal_metadata_json), so that mutations reach the JSON decoding: whoever can
// rewrite the file can rewrite its checksum. What it accepts must encode (to_json) to a
// document that decodes again and encodes to the same text, and the load planner runs on it
// for every rank of worlds of 1, 2 and 3 (tests/system/fuzz/plan_layouts.hpp).
#include <string>

#include "cairn/format/native/metadata.hpp"
#include "tests/system/fuzz/fuzz.hpp"
#include "tests/system/fuzz/plan_layouts.hpp"

namespace {

void decode(std::string_view json, bool allow_unverified) {
  auto m = cairn::metadata_from_json(json, "fuzz/metadata.json", allow_unverified);
  if (!m) return;
  cairn_fuzz::plan_on_ranks(*m);
  const std::string encoded = cairn::to_json(*m);
  auto again = cairn::metadata_from_json(encoded, "fuzz/re-encoded.json", allow_unverified);
  cairn_fuzz::check(bool(again), "metadata that decoded does not decode after to_json");
  cairn_fuzz::check(cairn::to_json(*again) == encoded,
                    "to_json of decoded metadata is not stable across a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view json = cairn_fuzz::text(data, size);
  const bool allow_unverified = size % 2 == 1;
  decode(json, allow_unverified);
  decode(cairn::reseal_metadata_json(json), allow_unverified);
  return 0;
}
