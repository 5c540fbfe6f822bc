// hostile/foreign: the readers of foreign formats (pickle, DCP `.metadata` and `.distcp` items,
// torch.save zips, Megatron's common.pt, safetensors) on input built to crash them, hang them or
// exhaust memory: reference cycles, a million-deep nest, memo bombs, huge claimed shapes and
// offsets. Each case runs in a forked child under 2 GiB and a time limit (tests/system/hostile/
// bounded.hpp) and must end in a clear cairn error. Each is also loaded as a checkpoint on 2
// and 3 thread ranks, every rank asking for its own piece (tests/system/hostile/ranks.hpp): the
// hostile bytes as the checkpoint's own file, or, for a bare pickle or archive, as the
// common.pt of an otherwise valid DCP checkpoint, which every load reads.
#include "cairn/format/foreign.hpp"

#include <doctest/doctest.h>

#include <string>

#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "tests/system/hostile/bounded.hpp"
#include "tests/system/hostile/pickle_asm.hpp"
#include "tests/system/hostile/ranks.hpp"

namespace {
using namespace pickle_asm;
namespace hb = cairn_hostile;
using cairn::errc;

/// Runs `fn` bounded and checks it ended in a cairn error of `code` mentioning `fragment`.
template <class F>
void expect_clear_error(F&& fn, errc code, std::string_view fragment) {
  hb::bounds b;
  b.seconds = 30;
  hb::report r = hb::run_bounded(fn, b);
  REQUIRE_MESSAGE(r.clear_error(), r.describe());
  CHECK_MESSAGE(r.code == code, r.describe());
  CHECK_MESSAGE(r.detail.find(fragment) != std::string::npos, r.describe());
}

cairn::result<void> discard(cairn::result<pk::value> r) {
  if (!r) return std::move(r).err();
  return cairn::ok();
}
std::span<const std::byte> bytes(const std::string& s) { return cairn::format_detail::as_bytes(s); }

/// A DCP checkpoint on `m` with one f32 tensor "w" of `numel` elements in one chunk, whose
/// `.distcp` item is an archive with data.pkl `item_pkl` and storage `storage`.
void dcp_with_item(cairn::memory_storage& m,
                   const std::string& item_pkl,
                   std::int64_t numel,
                   std::string_view storage) {
  auto len = static_cast<std::int64_t>(put_archive(m, "__0_0.distcp", item_pkl, storage));
  auto [k, v] = storage_entry("w", {0}, "__0_0.distcp", 0, len);
  put(m, ".metadata",
      metadata(dict({{str("w"), tensor_meta(cairn::dtype::f32, size({numel}),
                                            "(" + chunk({0}, {numel}) + "l")}}),
               dict({{k, v}})));
}

/// Loads `t` from `m` on 2 and 3 thread ranks in every layout: each load ends in the same clear
/// error on every rank (or succeeds on every rank), within the limits.
/// `max_layouts` limits the layouts per world size, for inputs that take seconds to refuse before
/// any rank asks for a piece (a million-deep nest is refused while the metadata is read).
void check_on_ranks(cairn::storage_ref m,
                    const hb::tensor_claim& t,
                    std::size_t max_layouts = SIZE_MAX) {
  hb::bounds b;
  b.seconds = 30;
  for (const auto& run : hb::load_on_ranks(m, t, {2, 3}, {}, b, max_layouts))
    CHECK_MESSAGE(run.clean(), run.describe());
}
void check_on_ranks(cairn::memory_storage&& m,
                    const hb::tensor_claim& t,
                    std::size_t max_layouts = SIZE_MAX) {
  check_on_ranks(cairn::storage_ref(m), t, max_layouts);
}

/// The tensor the checkpoints below hold (or claim): "w", one f32 element.
const hb::tensor_claim one_float{"w", cairn::dtype::f32, {1}, std::nullopt};

/// A valid DCP checkpoint holding `one_float` whose common.pt (Megatron's common state, read
/// by every load) is the torch.save archive around pickle `common_pkl`, or the raw bytes
/// `common_file` when given.
cairn::memory_storage dcp_with_common(const std::string& common_pkl,
                                      const std::string& common_file = {}) {
  cairn::memory_storage m;
  auto len = static_cast<std::int64_t>(put_archive(
      m, "__0_0.distcp", program(body(tensor_v2(cairn::dtype::f32, {1}, {1}))), "abcd"));
  auto [k, v] = storage_entry("w", {0}, "__0_0.distcp", 0, len);
  put(m, ".metadata",
      metadata(dict({{str("w"),
                      tensor_meta(cairn::dtype::f32, size({1}), "(" + chunk({0}, {1}) + "l")}}),
               dict({{k, v}})));
  if (common_file.empty())
    put_archive(m, "common.pt", common_pkl);
  else
    put(m, "common.pt", common_file);
  return m;
}

/// A DCP checkpoint whose `.metadata` is `meta` (and no other file).
cairn::memory_storage dcp_metadata_only(const std::string& meta) {
  cairn::memory_storage m;
  put(m, ".metadata", meta);
  return m;
}

/// `Parameter(L)` where `L = [the Parameter itself]`.
std::string self_wrapping_parameter() {
  return program(global("torch._utils", "_rebuild_parameter") + "]" + put(0) + "R" + put(1) +
                 get(0) + get(1) + "a0");
}
/// `d = {}; d[key] = d`.
std::string self_containing_dict(std::string_view key) {
  return program("}" + put(0) + str(key) + get(0) + "s");
}
/// `[[[...]]]`, `depth` lists deep.
std::string nested_lists(std::size_t depth) {
  return std::string(depth, ']') + std::string(depth - 1, 'a');
}

}  // namespace

// --- aliasing ------------------------------------------------------------------------------------

TEST_CASE("the 14-byte pickle: BUILD of a dict with itself read freed memory") {
  std::string p("}(K\x01K\x02K\x03K\x04u2b.", 14);
  hb::report r = hb::run_bounded([&]() -> cairn::result<void> {
    CAIRN_TRY_ASSIGN(pk::value v, pk::load(bytes(p), "build.pkl"));
    if (v.entries->size() != 2) return cairn::make_error(errc::corrupt, "not {1: 2, 3: 4}");
    return cairn::ok();
  });
  CHECK_MESSAGE(r.what == hb::outcome::succeeded, r.describe());
  check_on_ranks(dcp_with_common(p), one_float);
}

// --- reference cycles ----------------------------------------------------------------------------

TEST_CASE("a pickled list that contains itself is a corrupt error naming the offset") {
  std::string p = program("]" + put(0) + get(0) + "a");
  expect_clear_error([&] { return discard(pk::load(bytes(p), "l.pkl")); }, errc::corrupt,
                     "reference cycle");
  check_on_ranks(dcp_with_common(p), one_float);
}

TEST_CASE("a DCP .metadata whose torch.Size contains itself (as_shape recursed forever)") {
  // Size(L) with L = [that Size]: the shape of the only tensor.
  std::string cyclic_size =
      global("torch", "Size") + "]" + put(0) + "R" + put(1) + get(0) + get(1) + "a0";
  std::string meta = metadata(
      dict({{str("w"), tensor_meta(cairn::dtype::f32, cyclic_size, "(" + chunk({0}, {4}) + "l")}}),
      "}");
  expect_clear_error([&] { return cairn::dcp::decode(bytes(meta), ".metadata"); }, errc::corrupt,
                     "reference cycle");
  check_on_ranks(dcp_metadata_only(meta), {"w", cairn::dtype::f32, {4}, std::nullopt});
}

TEST_CASE("a torch.save Parameter that wraps itself (as_tensor recursed forever)") {
  cairn::memory_storage m;
  put_archive(m, "p.pt", self_wrapping_parameter());
  expect_clear_error(
      [&]() -> cairn::result<void> {
        CAIRN_TRY_ASSIGN(auto a, cairn::torch_zip::open_archive(m, "p.pt"));
        if (!cairn::torch_zip::as_tensor(a.root)) return cairn::make_error(errc::corrupt, "?");
        return cairn::ok();
      },
      errc::corrupt, "reference cycle");
  check_on_ranks(dcp_with_common(self_wrapping_parameter()), one_float);
}

TEST_CASE("a DCP .distcp item whose data.pkl wraps itself") {
  cairn::memory_storage m;
  dcp_with_item(m, self_wrapping_parameter(), 1, std::string(4, '\0'));
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "reference cycle");
  check_on_ranks(m, one_float);
}

TEST_CASE("find_tensors over a torch.save dict that contains itself (recursed forever)") {
  cairn::memory_storage m;
  put_archive(m, "d.pt", self_containing_dict("self"));
  expect_clear_error(
      [&]() -> cairn::result<void> {
        CAIRN_TRY_ASSIGN(auto a, cairn::torch_zip::open_archive(m, "d.pt"));
        return cairn::make_error(
            errc::io, std::to_string(cairn::torch_zip::find_tensors(a.root).size()) + " tensors");
      },
      errc::corrupt, "reference cycle");
  check_on_ranks(dcp_with_common(self_containing_dict("self")), one_float);
}

TEST_CASE("Megatron's common.pt holding a dict that contains itself (leaked on every load)") {
  cairn::memory_storage m;
  put(m, ".metadata", metadata("}", "}"));
  put_archive(m, "common.pt", self_containing_dict("model"));
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "reference cycle");
  check_on_ranks(m, one_float);
  check_on_ranks(dcp_with_common(self_containing_dict("model")), one_float);
}

// --- depth ---------------------------------------------------------------------------------------

TEST_CASE("a list nested a million deep (the destructor overflowed the stack)") {
  std::string p = program(nested_lists(1'000'000));
  expect_clear_error([&] { return discard(pk::load(bytes(p), "deep.pkl")); }, errc::resource,
                     "nest deeper");
  check_on_ranks(dcp_with_common(p), one_float, 1);
}

TEST_CASE("a DCP .metadata whose planner_data nests a million deep") {
  std::string meta = metadata("}", "}", dict({{str("w"), nested_lists(1'000'000)}}));
  expect_clear_error([&] { return cairn::dcp::decode(bytes(meta), ".metadata"); }, errc::resource,
                     "nest deeper");
  check_on_ranks(dcp_metadata_only(meta), {"w", cairn::dtype::f32, {4}, std::nullopt}, 1);
}

// --- memo bombs ----------------------------------------------------------------------------------

TEST_CASE("a memo-bomb DCP .metadata: 300 KB that would expand into 10^8 chunk records") {
  // One TensorStorageMetadata whose chunk list names one chunk 5000 times, shared by 20000 fqns.
  const int fqns = 20000, refs = 5000;
  std::string chunks = "(" + chunk({0}, {4}) + put(1);
  for (int i = 1; i < refs; ++i) chunks += get(1);
  chunks += "l";
  std::string sdm = "}(";
  for (int i = 0; i < fqns; ++i)
    sdm += str("w" + std::to_string(i)) +
           (i == 0 ? tensor_meta(cairn::dtype::f32, size({4}), chunks) + put(0) : get(0));
  sdm += "u";
  std::string meta = metadata(sdm, "}");
  CHECK(meta.size() < 400'000);
  expect_clear_error([&] { return cairn::dcp::decode(bytes(meta), ".metadata"); }, errc::resource,
                     "memo bomb");
  cairn::memory_storage m;
  put(m, ".metadata", meta);
  expect_clear_error([&] { return cairn::convert::open_source(m); }, errc::resource, "memo bomb");
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::resource, "memo bomb");
  check_on_ranks(m, {"w0", cairn::dtype::f32, {4}, std::nullopt});
  check_on_ranks(m, {"w19999", cairn::dtype::f32, {4}, std::nullopt});
}

TEST_CASE("a pickle that copies one 1 MB string 20000 times by memo GET (20 GB)") {
  std::string p = str(std::string(1 << 20, 'x')) + put(0) + "(";
  for (int i = 0; i < 20000; ++i) p += get(0);
  p = program(p + "l");
  expect_clear_error([&] { return discard(pk::load(bytes(p), "strings.pkl")); }, errc::resource,
                     "memo bomb");
  check_on_ranks(dcp_with_common(p), one_float);
}

TEST_CASE("a torch.save pickle sharing one tensor under 2^40 paths (find_tensors ran forever)") {
  std::string p = body(tensor_v2(cairn::dtype::f32, {1}, {1})) + put(0) + "0";
  for (std::uint32_t level = 1; level <= 40; ++level)
    p += "(" + get(level - 1) + get(level - 1) + "l" + put(level) + "0";
  p = program(p + "}" + str("model") + get(40) + "s");
  cairn::memory_storage m;
  put_archive(m, "bomb.pt", p);
  expect_clear_error(
      [&]() -> cairn::result<void> {
        CAIRN_TRY_ASSIGN(auto a, cairn::torch_zip::open_archive(m, "bomb.pt"));
        return cairn::make_error(
            errc::io, std::to_string(cairn::torch_zip::find_tensors(a.root).size()) + " tensors");
      },
      errc::resource, "memo bomb");
  check_on_ranks(dcp_with_common(p), one_float);
}

// --- huge claimed shapes and offsets -------------------------------------------------------------

TEST_CASE("DCP .metadata claiming tensors whose element counts overflow") {
  struct claim {
    cairn::dtype type;
    std::vector<std::int64_t> size, offsets, sizes;
  };
  const std::int64_t e62 = std::int64_t{1} << 62, e32 = std::int64_t{1} << 32;
  for (const claim& c :
       {claim{cairn::dtype::f32, {e62}, {0}, {e62}},
        claim{cairn::dtype::u8, {e32, e32}, {0, 0}, {e32, e32}},
        claim{cairn::dtype::u8, {e62, e62, 0}, {0, 0, 0}, {e62, e62, 0}},
        claim{cairn::dtype::u8, {e62}, {e62}, {e62}}, claim{cairn::dtype::u8, {8}, {-4}, {4}}}) {
    std::string meta = metadata(
        dict(
            {{str("w"), tensor_meta(c.type, size(c.size), "(" + chunk(c.offsets, c.sizes) + "l")}}),
        "}");
    expect_clear_error([&] { return cairn::dcp::decode(bytes(meta), ".metadata"); }, errc::corrupt,
                       "w");
    check_on_ranks(dcp_metadata_only(meta), {"w", c.type, c.size, std::nullopt});
  }
}

TEST_CASE("a DCP .distcp item at storage offset 2^62 (its byte offset wrapped to 0)") {
  cairn::memory_storage m;
  dcp_with_item(m, program(body(tensor_v2(cairn::dtype::f32, {1}, {1}, std::int64_t{1} << 62))), 1,
                std::string(4, '\0'));
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "w");
  check_on_ranks(m, one_float);
}

TEST_CASE("a DCP .distcp item claiming [2^32, 2^32] elements") {
  const std::int64_t e32 = std::int64_t{1} << 32;
  cairn::memory_storage m;
  dcp_with_item(m, program(body(tensor_v2(cairn::dtype::f32, {e32, e32}, {e32, 1}))), 1,
                std::string(4, '\0'));
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "w");
  check_on_ranks(m, one_float);
}

TEST_CASE("DCP _StorageInfo offset and length near 2^63") {
  cairn::memory_storage m;
  put_archive(m, "__0_0.distcp", program(body(tensor_v2(cairn::dtype::f32, {1}, {1}))));
  const std::int64_t big = INT64_MAX - 8;
  auto [k, v] = storage_entry("w", {0}, "__0_0.distcp", big, big);
  put(m, ".metadata",
      metadata(dict({{str("w"),
                      tensor_meta(cairn::dtype::f32, size({1}), "(" + chunk({0}, {1}) + "l")}}),
               dict({{k, v}})));
  expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "past the end");
  check_on_ranks(m, one_float);
}

TEST_CASE("read_tensor of a view claiming 3 x (2^62 + 1) elements (allocated its product)") {
  cairn::memory_storage m;
  put_archive(m, "t.pt", program(body(tensor_v2(cairn::dtype::f32, {1}, {1}))));
  const std::int64_t big = (std::int64_t{1} << 62) + 1;
  expect_clear_error(
      [&]() -> cairn::result<std::vector<std::byte>> {
        CAIRN_TRY_ASSIGN(auto a, cairn::torch_zip::open_archive(m, "t.pt"));
        cairn::torch_zip::tensor_ref t{cairn::dtype::f32, {3, big}, {big, 1}, 0, "0"};
        return cairn::torch_zip::read_tensor(a, t);
      },
      errc::corrupt, "2^62");
  // The same view as the tensor of a DCP checkpoint's item.
  cairn::memory_storage item;
  dcp_with_item(item, program(body(tensor_v2(cairn::dtype::f32, {3, big}, {big, 1}))), 3,
                std::string(12, '\0'));
  check_on_ranks(item, {"w", cairn::dtype::f32, {3}, std::nullopt});
}

TEST_CASE("safetensors headers claiming more than the file holds") {
  auto raw = [](std::uint64_t len, const std::string& json, std::size_t data) {
    std::string f;
    cairn::format_detail::put_le(f, len, 8);
    return f + json + std::string(data, '\0');
  };
  auto with = [&](const std::string& json, std::size_t data) {
    return raw(json.size(), json, data);
  };
  const std::string e62 = std::to_string(std::uint64_t{1} << 62);
  const std::string ok_json = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  for (
      const std::string& f : {
          raw(1000, ok_json, 4),        // header length past the end of the file
          raw(UINT64_MAX, ok_json, 4),  // header length 2^64 - 1
          raw(99'000'000, "{}", 0),     // a 99 MB header in a 10-byte file
          with(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
          with(R"({"a":{"dtype":"U8","shape":[)" + e62 + R"(],"data_offsets":[0,)" + e62 + "]}}",
               4),
          with(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}})", 4),
          with(
              R"({"a":{"dtype":"U8","shape":[)" + e62 + "," + e62 +
                  R"(,0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
              4),
      }) {
    cairn::memory_storage m;
    put(m, "model.safetensors", f);
    expect_clear_error([&] { return cairn::safetensors_as_metadata(m); }, errc::corrupt,
                       "safetensors");
    check_on_ranks(m, {"a", cairn::dtype::f32, {1}, std::nullopt});
    check_on_ranks(m, {"a", cairn::dtype::u8, {4}, std::nullopt});
  }
}

TEST_CASE("a safetensors index claiming total_size 1e300") {
  cairn::memory_storage m;
  put(m, "model.safetensors.index.json",
      R"({"metadata":{"total_size":1e300},"weight_map":{"a":"model.safetensors"}})");
  expect_clear_error([&] { return cairn::safetensors_as_metadata(m); }, errc::corrupt,
                     "total_size");
  check_on_ranks(m, {"a", cairn::dtype::f32, {1}, std::nullopt});
}

TEST_CASE("a zip whose zip64 locator points near 2^64") {
  cairn::memory_storage m;
  put_archive(m, "z.pt", program("N"));
  std::vector<std::byte> z(m.size("z.pt").value());
  m.read("z.pt", 0, z).value();
  std::string s(reinterpret_cast<const char*>(z.data()), z.size());
  std::string eocd = s.substr(s.size() - 22), locator;
  cairn::format_detail::put_le(locator, 0x07064b50, 4);
  cairn::format_detail::put_le(locator, 0, 4);
  cairn::format_detail::put_le(locator, UINT64_MAX - 15, 8);
  cairn::format_detail::put_le(locator, 1, 4);
  eocd[10] = eocd[11] = '\xff';  // 0xFFFF records: look for the zip64 end record
  put(m, "z.pt", s.substr(0, s.size() - 22) + locator + eocd);
  expect_clear_error([&] { return cairn::torch_zip::open_zip(m, "z.pt"); }, errc::corrupt, "zip");
  check_on_ranks(dcp_with_common("", s.substr(0, s.size() - 22) + locator + eocd), one_float);
}

TEST_CASE("a DCP checkpoint of tiny files claiming a 4 TB tensor (consolidate allocated it)") {
  const std::int64_t e40 = std::int64_t{1} << 40;
  for (std::int64_t chunk_elems : {e40, std::int64_t{1}}) {
    cairn::memory_storage m;
    auto len = static_cast<std::int64_t>(put_archive(
        m, "__0_0.distcp", program(body(tensor_v2(cairn::dtype::f32, {1}, {1}))), "abcd"));
    auto [k, v] = storage_entry("w", {0}, "__0_0.distcp", 0, len);
    put(m, ".metadata",
        metadata(dict({{str("w"), tensor_meta(cairn::dtype::f32, size({e40}),
                                              "(" + chunk({0}, {chunk_elems}) + "l")}}),
                 dict({{k, v}})));
    expect_clear_error(
        [&]() -> cairn::result<void> {
          CAIRN_TRY_ASSIGN(auto src, cairn::convert::open_source(m));
          CAIRN_TRY(cairn::convert::consolidate(*src));
          return cairn::ok();
        },
        errc::corrupt, "w");
    expect_clear_error([&] { return cairn::dcp_as_metadata(m); }, errc::corrupt, "w");
    check_on_ranks(m, {"w", cairn::dtype::f32, {e40}, cairn::box{{1}, {e40 - 1}}});
  }
}
