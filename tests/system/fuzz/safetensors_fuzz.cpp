// Fuzz target "safetensors": a whole safetensors file in a memory_storage, read as a loader
// does: safetensors::read_header (8-byte length, JSON header, every validation rule), then each
// tensor of at most 1 MiB with read_tensor and a partial read_range. An accepted header must
// describe tensors that lie inside the file. The file as a checkpoint
// (safetensors_as_metadata) then goes through the load planner for every rank of worlds of 1,
// 2 and 3 (tests/system/fuzz/plan_layouts.hpp).
#include <vector>

#include "cairn/format/safetensors/file.hpp"
#include "cairn/format/safetensors/reader.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/system/fuzz/fuzz.hpp"
#include "tests/system/fuzz/plan_layouts.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cairn::memory_storage mem;
  if (!mem.put("model.safetensors", cairn_fuzz::bytes(data, size))) return 0;
  cairn::storage_ref st(mem);
  auto h = cairn::safetensors::read_header(st, "model.safetensors");
  if (!h) return 0;
  std::vector<std::byte> buf;
  for (const auto& t : h->tensors) {
    cairn_fuzz::check(t.end >= t.begin && t.file_offset() + t.nbytes() <= size,
                      "an accepted header has a tensor outside the file");
    if (t.nbytes() > cairn_fuzz::max_read_bytes) continue;
    buf.resize(static_cast<std::size_t>(t.nbytes()));
    auto r = cairn::safetensors::read_tensor(st, "model.safetensors", *h, t.name, buf);
    cairn_fuzz::check(bool(r), "read_tensor failed on a tensor of an accepted header");
    if (t.nbytes() >= 2) {
      std::span<std::byte> half(buf.data(), static_cast<std::size_t>(t.nbytes() / 2));
      r = cairn::safetensors::read_range(st, "model.safetensors", *h, t.name, t.nbytes() / 4, half);
      cairn_fuzz::check(bool(r), "read_range failed inside a tensor of an accepted header");
    }
  }
  auto m = cairn::safetensors_as_metadata(st);
  cairn_fuzz::check(bool(m), "a file whose header reads is not a checkpoint");
  cairn_fuzz::plan_on_ranks(*m);
  return 0;
}
