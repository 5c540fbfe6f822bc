// The format registry (format/registry.hpp, format/writers.hpp): writers made by format id, a
// user's own writer registered beside them; and the one DCP reader (format/dcp/reader.hpp) that
// `load` (through `dcp_as_metadata`) and `convert` (through `dcp_source`) share.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/strategies.hpp"

namespace {

/// A user's writer: the native format under another id, wrapping the native strategy (no
/// `cairn::detail` name needed).
class wrapped_native final : public cairn::save_strategy {
 public:
  std::string_view name() const noexcept override { return "wrapped_native"; }
  bool tiles(const cairn::save_options& o) const noexcept override { return native_.tiles(o); }
  cairn::result<void> write(cairn::planned_save& plan,
                            cairn::storage_ref st,
                            const cairn::save_options& opt,
                            cairn::buffer_pool* buffers,
                            cairn::written_save& out) const override {
    ++writes;
    return native_.write(plan, st, opt, buffers, out);
  }
  cairn::result<void> commit(cairn::planned_save& plan,
                             cairn::written_save& w,
                             const std::vector<cairn::bytes>& reports,
                             const std::vector<cairn::bytes>& locals,
                             cairn::storage_ref st,
                             const cairn::save_options& opt) const override {
    return native_.commit(plan, w, reports, locals, st, opt);
  }
  void abandon(const cairn::planned_save& plan,
               const cairn::written_save& w,
               cairn::storage_ref st) const override {
    native_.abandon(plan, w, st);
  }
  cairn::result<bool> committed(const cairn::planned_save& plan,
                                const cairn::written_save& w,
                                cairn::storage_ref st) const override {
    return native_.committed(plan, w, st);
  }
  static inline int writes = 0;

 private:
  cairn::native_strategy native_;
};

const bool wrapped_registered = cairn::register_save_strategy(
    "wrapped_native", [] { return std::unique_ptr<cairn::save_strategy>(new wrapped_native()); });

}  // namespace

TEST_CASE("make_save_strategy makes the writer of each registered format id") {
  CHECK(wrapped_registered);
  for (std::string id : {"native", "torch_dist", "one_file", "per_tensor", "chunks"}) {
    INFO(id);
    auto s = cairn::make_save_strategy(id);
    REQUIRE(s);
    CHECK((*s)->name() == id);
  }
  auto ids = cairn::save_strategy_ids();
  CHECK(std::is_sorted(ids.begin(), ids.end()));
  CHECK(std::find(ids.begin(), ids.end(), "wrapped_native") != ids.end());
  auto unknown = cairn::make_save_strategy("npz");
  REQUIRE(!unknown);
  CHECK(unknown.err().code == cairn::errc::not_found);
  CHECK(unknown.err().message.find("'npz'") != std::string::npos);
  CHECK(unknown.err().message.find("torch_dist") != std::string::npos);  // names what there is
}

TEST_CASE("a user's writer registered by id saves a checkpoint that load reads") {
  std::vector<float> w(12);
  std::iota(w.begin(), w.end(), 1.0f);
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {3, 4}, {}));
  cairn::memory_storage mem;
  cairn::single_communicator one;
  auto s = cairn::make_save_strategy("wrapped_native").value();
  const int before = wrapped_native::writes;
  cairn::save(sd, mem, one, {.strategy = s.get()});
  CHECK(wrapped_native::writes == before + 1);
  CHECK(cairn::detect_format(mem).value() == "cairn");
  std::vector<float> back(12, 0.0f);
  cairn::state_dict ld;
  ld.add("w", cairn::from_rank_offsets("w", std::span(back), {3, 4}, {}));
  cairn::load(ld, mem, one);
  CHECK(back == w);
}

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

TEST_CASE("the DCP reader reads strided items for convert; load refuses them naming the key") {
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
  CHECK(src->kind() == "dcp");
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
