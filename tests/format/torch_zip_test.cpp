// torch_zip: stored ZIP with torch's alignment, torch.save archives of tensors, views.
#include "cairn/format/torch_zip.hpp"

#include <doctest/doctest.h>

#include <numeric>

#include "cairn/storage/memory.hpp"

namespace tz = cairn::torch_zip;

TEST_CASE("crc32 matches the standard check value") {
  CHECK(tz::crc32(0, cairn::format_detail::as_bytes("123456789")) == 0xCBF43926u);
  std::string big(1000, 'q');
  auto whole = tz::crc32(0, cairn::format_detail::as_bytes(big));
  auto part = tz::crc32(tz::crc32(0, cairn::format_detail::as_bytes(big.substr(0, 333))),
                        cairn::format_detail::as_bytes(big.substr(333)));
  CHECK(whole == part);
}

TEST_CASE(".pt of named tensors: aligned records, read back element-exactly, deterministic") {
  std::vector<float> w(12);
  std::iota(w.begin(), w.end(), -3.f);
  std::vector<cairn::bf16> h{cairn::bf16(1.5f), cairn::bf16(-7.f)};
  std::vector<std::uint8_t> flags{1, 0, 1};
  std::vector<std::int64_t> step{42};
  std::vector<tz::tensor_view> ts{
      {"layer.w", cairn::dtype::f32, {3, 4}, std::as_bytes(std::span(w))},
      {"h", cairn::dtype::bf16, {2}, std::as_bytes(std::span(h))},
      {"mask", cairn::dtype::bool_, {3}, std::as_bytes(std::span(flags))},
      {"step", cairn::dtype::i64, {}, std::as_bytes(std::span(step))},
      {"empty", cairn::dtype::f64, {0, 5}, {}},
  };
  cairn::memory_storage m;
  tz::write_pt(m, "dir/model.pt", ts).value();
  auto a = tz::open_archive(m, "dir/model.pt").value();
  CHECK(a.prefix == "model");
  for (const auto& r : a.zip.records) CHECK(r.data_offset % 64 == 0);
  auto found = tz::find_tensors(a.root);
  REQUIRE(found.size() == ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    CHECK(found[i].first == ts[i].name);
    CHECK(found[i].second.type == ts[i].type);
    CHECK(found[i].second.dims == ts[i].dims);
    auto bytes = tz::read_tensor(a, found[i].second).value();
    CHECK(std::equal(bytes.begin(), bytes.end(), ts[i].data.begin(), ts[i].data.end()));
  }
  cairn::memory_storage m2;
  tz::write_pt(m2, "dir/model.pt", ts).value();
  std::vector<std::byte> b1(m.size("dir/model.pt").value()), b2(b1.size());
  m.read("dir/model.pt", 0, b1).value();
  m2.read("dir/model.pt", 0, b2).value();
  CHECK(b1 == b2);

  // A flipped payload byte is caught by the CRC when the record is read whole.
  b1[a.zip.find("model/data.pkl")->data_offset + 3] ^= std::byte{1};
  m.put("bad.pt", b1).value();
  auto bad = tz::open_archive(m, "bad.pt");
  REQUIRE(!bad);
  CHECK(bad.err().message.find("CRC") != std::string::npos);
  CHECK(bad.err().key == "model/data.pkl");
}

TEST_CASE("archives concatenated in one object (DCP .distcp items) and strided views") {
  cairn::memory_storage m;
  auto w = m.open_writer("__0_0.distcp").value();
  std::vector<std::int32_t> x(6);
  std::iota(x.begin(), x.end(), 10);
  std::uint64_t off = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  for (int i = 0; i < 3; ++i) {
    auto len = tz::write_tensor_item(*w, off,
                                     {"t", cairn::dtype::i32, {2, 3}, std::as_bytes(std::span(x))})
                   .value();
    items.emplace_back(off, len);
    off += len;
    x[0] += 100;
  }
  w->finish().value();
  for (int i = 0; i < 3; ++i) {
    auto a = tz::open_archive(m, "__0_0.distcp", items[i].first, items[i].second).value();
    CHECK(a.prefix == "archive");
    auto t = tz::as_tensor(a.root);
    REQUIRE(t);
    auto bytes = tz::read_tensor(a, *t).value();
    std::vector<std::int32_t> back(6);
    std::memcpy(back.data(), bytes.data(), bytes.size());
    CHECK(back[0] == 10 + 100 * i);
    CHECK(back[5] == 15);
    // A transposed view of the same storage: sizes (3, 2), strides (1, 3), offset 0.
    tz::tensor_ref tr = *t;
    tr.dims = {3, 2};
    tr.strides = {1, 3};
    auto tb = tz::read_tensor(a, tr).value();
    std::memcpy(back.data(), tb.data(), tb.size());
    CHECK(back == std::vector<std::int32_t>{10 + 100 * i, 13, 11, 14, 12, 15});
    tr.storage_offset = 1;  // now runs past the storage
    CHECK(tz::read_tensor(a, tr).err().code == cairn::errc::corrupt);
  }
  CHECK(!tz::open_zip(m, "__0_0.distcp", 0, 10));
}
