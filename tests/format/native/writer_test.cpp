// The native block writer (format/native/writer.hpp): compressed runs are appended in task
// order, so the same items give the same bytes whatever order the io threads finish in.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/storage/fault_injection.hpp"

namespace {

/// Items of varied compressibility: runs of one byte and pseudo-random stretches, with one
/// object (stored raw) in the middle.
std::vector<std::vector<std::byte>> item_bytes() {
  std::vector<std::vector<std::byte>> out;
  std::uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 24; ++i) {
    std::vector<std::byte> b(static_cast<std::size_t>(300 + 97 * i));
    for (std::size_t k = 0; k < b.size(); ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b[k] = (i % 3 == 0) ? std::byte{static_cast<unsigned char>(i)}
                          : static_cast<std::byte>(x & (i % 3 == 1 ? 0x0f : 0xff));
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// Writes the items compressed with `threads` threads; returns the object's bytes and the
/// items' recorded block offsets.
std::pair<std::vector<std::byte>, std::vector<std::vector<std::uint64_t>>> write_once(
    const std::vector<std::vector<std::byte>>& data, int threads) {
  std::vector<cairn::write_item> items;
  for (std::size_t i = 0; i < data.size(); ++i) {
    cairn::write_item it{data[i].data(), data[i].size(), 0, "item" + std::to_string(i), {}, {}, {}};
    it.is_object = i == data.size() / 2;
    items.push_back(std::move(it));
  }
  cairn::memory_storage m;
  std::uint64_t size = 0;
  cairn::detail::write_items(m, "data", items, 128, threads, nullptr, 3, &size).value();
  std::vector<std::byte> bytes(m.size("data").value());
  m.read("data", 0, bytes).value();
  CHECK(bytes.size() == size);
  std::vector<std::vector<std::uint64_t>> offsets;
  for (const auto& it : items) offsets.push_back(it.block_offsets);
  return {std::move(bytes), std::move(offsets)};
}

}  // namespace

TEST_CASE("compressed runs are appended in task order: the same items give the same bytes") {
  const auto data = item_bytes();
  const auto one = write_once(data, 1);
  REQUIRE(!one.first.empty());
  for (int rep = 0; rep < 20; ++rep) {
    INFO("repetition " << rep);
    const auto many = write_once(data, 4);
    CHECK(many.first == one.first);
    CHECK(many.second == one.second);
  }
}

TEST_CASE("a failed compressed write holds up no later task: the save fails with the error") {
  const auto data = item_bytes();
  std::vector<cairn::write_item> items;
  for (std::size_t i = 0; i < data.size(); ++i)
    items.push_back({data[i].data(), data[i].size(), 0, "item" + std::to_string(i), {}, {}, {}});
  // Storage that fails every write after the third: tasks waiting for their turn behind a
  // failed one still get it, so the writer returns the error rather than hanging.
  cairn::memory_storage mem;
  cairn::faulty_storage faulty{mem};
  faulty.fail_after_writes(3);
  auto r = cairn::detail::write_items(faulty, "data", items, 128, 4, nullptr, 3);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::io);
}
