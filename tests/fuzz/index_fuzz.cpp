// Fuzz target "index": the binary index file of format version 4
// (cairn/format/native/index_file.hpp): check_index_file on the input, and read_index_section on
// the input as one section whose manifest entry matches it (whoever can rewrite the file can
// rewrite the manifest's checksum), so that mutations reach the field checks. What it accepts
// must encode (append_index_section) to the same bytes.
#include <span>
#include <string>

#include "cairn/format/native/index_file.hpp"
#include "tests/fuzz/fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  (void)cairn::check_index_file(in, "fuzz/index.cairn");
  // The key is what the section says (when it can be read), so the key check passes.
  std::string key;
  if (size >= 4) {
    std::uint32_t n = 0;
    std::memcpy(&n, data, 4);
    if (n <= size - 4) key.assign(reinterpret_cast<const char*>(data) + 4, n);
  }
  cairn::index_section s{key, 0, size, cairn::checksum(in)};
  auto r = cairn::read_index_section(in, s, "fuzz/index.cairn", 64, 4);
  if (!r) return 0;
  cairn::bytes again;
  cairn::append_index_section(again, r->first, r->second);
  cairn_fuzz::check(again.size() == size && std::memcmp(again.data(), data, size) == 0,
                    "an accepted index section does not encode to the same bytes");
  return 0;
}
