// torch_zip: stored ZIP with torch's alignment, torch.save archives of tensors, views.
#include "cairn/format/torch/zip.hpp"

#include <doctest/doctest.h>

#include <cstring>
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

TEST_CASE("tensors with overflowing, negative or non-integer sizes are not tensors") {
  namespace pk = cairn::pickle;
  const std::int64_t e32 = std::int64_t{1} << 32, e62 = std::int64_t{1} << 62;
  auto make = [](std::vector<pk::value> dims, std::vector<pk::value> strides, pk::value off) {
    pk::value pid =
        pk::value::tuple({pk::value::string("storage"), pk::value::global("torch", "FloatStorage"),
                          pk::value::string("0"), pk::value::string("cpu"), pk::value::integer(1)});
    return pk::value::instance(
        "torch._utils", "_rebuild_tensor_v2",
        pk::value::tuple({pk::value::persistent(pid), off, pk::value::tuple(std::move(dims)),
                          pk::value::tuple(std::move(strides)), pk::value::boolean(false),
                          pk::value::none()}),
        pk::value(), false);
  };
  auto i = [](std::int64_t x) { return pk::value::integer(x); };
  CHECK(tz::as_tensor(make({i(2), i(3)}, {i(3), i(1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(e32), i(e32)}, {i(e32), i(1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(e62), i(e62), i(0)}, {i(1), i(1), i(1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(-1)}, {i(1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(2)}, {i(-1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(2)}, {i(1)}, i(-5))));
  CHECK(!tz::as_tensor(make({pk::value::string("2")}, {i(1)}, i(0))));
  CHECK(!tz::as_tensor(make({i(2)}, {i(1)}, pk::value::none())));
  // A Parameter around a Parameter around a tensor is one; a value built by hand around itself
  // is not (and does not recurse forever).
  pk::value t = make({i(2)}, {i(1)}, i(0));
  auto param = [](pk::value x) {
    return pk::value::instance("torch._utils", "_rebuild_parameter", pk::value::tuple({x}),
                               pk::value(), false);
  };
  CHECK(tz::as_tensor(param(param(t))));
  pk::value self = param(pk::value::none());
  self.obj->args = pk::value::list({self});
  CHECK(!tz::as_tensor(self));
  self.obj->args = pk::value();  // break the cycle the test made
  // find_tensors skips the invalid ones.
  pk::value root = pk::value::dict(
      {{pk::value::string("ok"), t}, {pk::value::string("bad"), make({i(-1)}, {i(1)}, i(0))}});
  auto found = tz::find_tensors(root);
  REQUIRE(found.size() == 1);
  CHECK(found[0].first == "ok");
}

TEST_CASE("read_tensor checks a view against its storage before allocating") {
  cairn::memory_storage m;
  std::vector<float> x{1, 2, 3, 4};
  tz::write_pt(m, "t.pt", {{"t", cairn::dtype::f32, {4}, std::as_bytes(std::span(x))}}).value();
  auto a = tz::open_archive(m, "t.pt").value();
  auto t = tz::find_tensors(a.root).at(0).second;
  const std::int64_t big = (std::int64_t{1} << 62) + 1;
  auto bad = [&](cairn::shape dims, cairn::shape strides, std::int64_t off) {
    tz::tensor_ref r = t;
    r.dims = std::move(dims);
    r.strides = std::move(strides);
    r.storage_offset = off;
    auto got = tz::read_tensor(a, r);
    REQUIRE(!got);
    return got.err().code;
  };
  CHECK(bad({3, big}, {big, 1}, 0) == cairn::errc::corrupt);
  CHECK(bad({4}, {-1}, 3) == cairn::errc::corrupt);
  CHECK(bad({4}, {1}, std::int64_t{1} << 62) == cairn::errc::corrupt);
  CHECK(bad({2, 2}, {1 << 30, 1}, 0) == cairn::errc::corrupt);  // past the storage
  // A broadcast view (stride 0, as `expand` saves) is gathered; a huge one is refused.
  tz::tensor_ref e = t;
  e.dims = {3, 4};
  e.strides = {0, 1};
  auto rows = tz::read_tensor(a, e).value();
  REQUIRE(rows.size() == 48);
  CHECK(std::memcmp(rows.data() + 32, x.data(), 16) == 0);
  e.dims = {std::int64_t{1} << 40, 4};
  CHECK(tz::read_tensor(a, e).err().code == cairn::errc::resource);
}

TEST_CASE("zip ranges that overflow are corrupt errors") {
  cairn::memory_storage m;
  std::vector<std::int32_t> x{1};
  auto w = m.open_writer("a.distcp").value();
  auto len =
      tz::write_tensor_item(*w, 0, {"t", cairn::dtype::i32, {1}, std::as_bytes(std::span(x))})
          .value();
  w->finish().value();
  CHECK(tz::open_zip(m, "a.distcp", 0, len));
  CHECK(tz::open_zip(m, "a.distcp", UINT64_MAX - 10, 100).err().code == cairn::errc::corrupt);
  CHECK(tz::open_zip(m, "a.distcp", 16, len).err().code == cairn::errc::corrupt);
  CHECK(tz::open_zip(m, "a.distcp", 0, std::uint64_t{1} << 62).err().code == cairn::errc::corrupt);
}

TEST_CASE("dtypes without a legacy storage class pickle torch.storage.UntypedStorage") {
  // torch 2.x pickles u16, u32, u64 and float8 tensors with _rebuild_tensor_v3 and the
  // UntypedStorage of module torch.storage: the global torch.load(weights_only=True) allows.
  std::vector<std::uint16_t> u{1, 2, 65535};
  std::vector<tz::tensor_view> ts{{"u", cairn::dtype::u16, {3}, std::as_bytes(std::span(u))}};
  cairn::memory_storage m;
  tz::write_pt(m, "u.pt", ts).value();
  auto a = tz::open_archive(m, "u.pt").value();
  const auto* pkl = a.zip.find("u/data.pkl");
  REQUIRE(pkl);
  std::string bytes(pkl->size, '\0');
  m.read("u.pt", pkl->data_offset, std::as_writable_bytes(std::span(bytes))).value();
  CHECK(bytes.find("ctorch.storage\nUntypedStorage\n") != std::string::npos);
  CHECK(bytes.find("_rebuild_tensor_v3") != std::string::npos);
  auto found = tz::find_tensors(a.root);
  REQUIRE(found.size() == 1);
  CHECK(found[0].second.type == cairn::dtype::u16);
  auto back = tz::read_tensor(a, found[0].second).value();
  CHECK(std::equal(back.begin(), back.end(), ts[0].data.begin(), ts[0].data.end()));
}
