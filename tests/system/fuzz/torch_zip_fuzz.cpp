// Fuzz target "torch_zip": a torch.save file in a memory_storage, read as cairn's DCP and
// Megatron readers do: torch_zip::open_archive (zip and zip64 directories, version and byteorder
// records, data.pkl), every record of at most 1 MiB with its CRC-32, then every tensor found by
// find_tensors whose declared size is at most 1 MiB with read_tensor.
#include <cstdint>

#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/memory.hpp"
#include "tests/system/fuzz/fuzz.hpp"

namespace {

/// dtype size × numel of `t`, or UINT64_MAX when a dimension is negative or it overflows.
std::uint64_t declared_bytes(const cairn::torch_zip::tensor_ref& t) {
  std::uint64_t n = cairn::dtype_size(t.type);
  for (std::int64_t d : t.dims) {
    if (d < 0) return UINT64_MAX;
    if (d != 0 && n > UINT64_MAX / static_cast<std::uint64_t>(d)) return UINT64_MAX;
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace tz = cairn::torch_zip;
  cairn::memory_storage mem;
  if (!mem.put("archive.pt", cairn_fuzz::bytes(data, size))) return 0;
  auto a = tz::open_archive(cairn::storage_ref(mem), "archive.pt");
  if (!a) return 0;
  for (const auto& r : a->zip.records)
    if (r.size <= cairn_fuzz::max_read_bytes) (void)a->zip.read_all(r);
  int read = 0;
  for (const auto& [key, t] : tz::find_tensors(a->root)) {
    if (declared_bytes(t) > cairn_fuzz::max_read_bytes || ++read > 64) continue;
    auto bytes = tz::read_tensor(*a, t);
    if (bytes)
      cairn_fuzz::check(bytes->size() == declared_bytes(t),
                        "read_tensor returned a size other than the tensor's");
  }
  return 0;
}
