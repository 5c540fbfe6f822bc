// The DCP reader (format/dcp/reader.hpp) that `load` (through `dcp_as_metadata`) and `convert`
// (through `dcp_source`) share: strided items read for convert and refused by load, and a chunk
// without its storage item.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/strategies.hpp"

namespace {

/// A DCP checkpoint whose one item is a strided view: `t` (i32, 3 × 2) is the transpose of the
/// 2 × 3 storage 0..5, i.e. [[0, 3], [1, 4], [2, 5]].
void write_strided_dcp(cairn::memory_storage& m) {
  namespace pk = cairn::pickle;
  std::vector<std::int32_t> storage(6);
  std::iota(storage.begin(), storage.end(), 0);
  pk::value pid =
      pk::value::tuple({pk::value::string("storage"), pk::value::global("torch", "IntStorage"),
                        pk::value::string("0"), pk::value::string("cpu"), pk::value::integer(6)});
  pk::value root = pk::value::instance(
      "torch._utils", "_rebuild_tensor_v2",
      pk::value::tuple({pk::value::persistent(pid), pk::value::integer(0),
                        pk::value::tuple({pk::value::integer(3), pk::value::integer(2)}),
                        pk::value::tuple({pk::value::integer(1), pk::value::integer(3)}),
                        pk::value::boolean(false), pk::value::none()}),
      pk::value(), false);
  auto out = m.open_writer("__0_0.distcp").value();
  std::span<const std::byte> data = std::as_bytes(std::span(storage));
  std::uint64_t len =
      cairn::torch_zip::write_archive(*out, 0, "archive", root, std::span(&data, 1)).value();
  out->finish().value();
  cairn::dcp::metadata md;
  cairn::dcp::add_tensor_chunk(md, "t", cairn::dtype::i32, {3, 2}, cairn::box{{0, 0}, {3, 2}},
                               {"__0_0.distcp", 0, len});
  cairn::dcp::write(m, md).value();
}

std::vector<std::int32_t> as_ints(const std::vector<std::byte>& b) {
  std::vector<std::int32_t> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

}  // namespace

TEST_CASE("the DCP reader reads strided items for convert, load refuses them naming the key") {
  cairn::memory_storage m;
  write_strided_dcp(m);
  auto rd = cairn::dcp::reader::open(m).value();
  std::vector<std::byte> whole(24), col(8);
  rd.read_box("t", cairn::box{{0, 0}, {3, 2}}, whole).value();
  CHECK(as_ints(whole) == std::vector<std::int32_t>{0, 3, 1, 4, 2, 5});
  rd.read_box("t", cairn::box{{1, 1}, {2, 1}}, col).value();
  CHECK(as_ints(col) == std::vector<std::int32_t>{4, 5});
  CHECK(rd.read_box("u", cairn::box{{0}, {1}}, col).err().code == cairn::errc::not_found);

  // convert reads through the same reader.
  auto src = cairn::convert::open_source(m).value();
  CHECK(src->kind() == "torch_dist");
  std::vector<std::byte> again(24);
  src->read_box("t", cairn::box{{0, 0}, {3, 2}}, again).value();
  CHECK(again == whole);

  // load needs byte ranges: a strided item cannot be one.
  auto meta = cairn::dcp_as_metadata(m);
  REQUIRE(!meta);
  CHECK(meta.err().code == cairn::errc::unsupported_version);
  CHECK(meta.err().key == "t");
  CHECK(meta.err().message.find("cairn convert") != std::string::npos);
}

TEST_CASE("the DCP reader refuses a chunk without its item, naming key and file") {
  cairn::memory_storage m;
  write_strided_dcp(m);
  auto md = cairn::dcp::read(m).value();
  md.storage_data.clear();  // .metadata lists the chunk, not where it is
  cairn::dcp::write(m, md).value();
  auto rd = cairn::dcp::reader::open(m);
  REQUIRE(!rd);
  CHECK(rd.err().code == cairn::errc::corrupt);
  CHECK(rd.err().key == "t");
  CHECK(rd.err().file.find(".metadata") != std::string::npos);
  CHECK(cairn::dcp_as_metadata(m).err().code == cairn::errc::corrupt);
  CHECK(!cairn::convert::open_source(m));
}
