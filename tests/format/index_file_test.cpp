// The binary index file of format version 4 (format/native/index_file.hpp): round trips, and
// every flipped byte, truncation and lying count refused as corrupt, naming the file and an
// offset.
#include "cairn/format/native/index_file.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using cairn::box;
using cairn::chunk_record;
using cairn::extent;
using cairn::tensor_record;

constexpr std::uint64_t block = 64;

/// A few tensors covering what a section holds: untiled, tiled, compressed, scalar, empty.
std::vector<std::pair<std::string, tensor_record>> sample_tensors() {
  std::vector<std::pair<std::string, tensor_record>> out;
  {  // [8, 6] f32 in two row blocks, untiled: 96 bytes each, two checksums each
    tensor_record t{cairn::dtype::f32, {8, 6}, {}};
    t.chunks.push_back(chunk_record{box{{0, 0}, {4, 6}}, extent{0, 0, 96, {11, 12}}, {}});
    t.chunks.push_back(chunk_record{box{{4, 0}, {4, 6}}, extent{1, 0, 96, {13, 14}}, {}});
    out.emplace_back("layers.0.weight", std::move(t));
  }
  {  // [4, 16] bf16, one chunk tiled 2 x 2, compressed
    tensor_record t{cairn::dtype::bf16, {4, 16}, {}};
    extent e{0, 96, 128, {1, 2, 3, 4}, {200, 230, 260, 290}, {30, 30, 30, 32}};
    t.chunks.push_back(chunk_record{box{{0, 0}, {4, 16}}, e, {2, 2}});
    out.emplace_back("layers.0.bias", std::move(t));
  }
  {  // a scalar and an empty tensor
    tensor_record s{cairn::dtype::i64, {}, {}};
    s.chunks.push_back(chunk_record{box{{}, {}}, extent{1, 96, 8, {99}}, {}});
    out.emplace_back("step", std::move(s));
    tensor_record z{cairn::dtype::u8, {0, 3}, {}};
    z.chunks.push_back(chunk_record{box{{0, 0}, {0, 3}}, extent{1, 104, 0, {}}, {}});
    out.emplace_back("empty", std::move(z));
  }
  return out;
}

bool same(const tensor_record& a, const tensor_record& b) {
  if (a.type != b.type || a.global_shape != b.global_shape || a.chunks.size() != b.chunks.size())
    return false;
  for (std::size_t i = 0; i < a.chunks.size(); ++i) {
    const auto &x = a.chunks[i], &y = b.chunks[i];
    if (x.region.offset != y.region.offset || x.region.size != y.region.size ||
        x.tiles != y.tiles || x.where.file != y.where.file ||
        x.where.byte_offset != y.where.byte_offset || x.where.nbytes != y.where.nbytes ||
        x.where.checksums != y.where.checksums || x.where.block_offsets != y.where.block_offsets ||
        x.where.block_stored != y.where.block_stored)
      return false;
  }
  return true;
}

struct built {
  cairn::bytes file;
  std::vector<cairn::index_section> sections;
};

built build() {
  built b;
  cairn::index_file_builder builder;
  for (const auto& [k, t] : sample_tensors()) b.sections.push_back(builder.add(k, t));
  b.file = builder.finish();
  return b;
}

std::span<const std::byte> bytes_of(const built& b, const cairn::index_section& s) {
  return std::span(b.file).subspan(s.offset, s.length);
}

const std::string where = "ckpt/index.0.abc.cairn";

}  // namespace

TEST_CASE("index file: sections round-trip and the file checks") {
  built b = build();
  REQUIRE(cairn::check_index_file(b.file, where));
  auto tensors = sample_tensors();
  REQUIRE(b.sections.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto got =
        cairn::read_index_section(bytes_of(b, b.sections[i]), b.sections[i], where, block, 2);
    REQUIRE(got);
    CHECK(got->first == tensors[i].first);
    CHECK(same(got->second, tensors[i].second));
  }
}

TEST_CASE("index file: every flipped byte fails the file check and the section read") {
  built b = build();
  for (std::size_t at = 0; at < b.file.size(); ++at) {
    for (std::byte mask : {std::byte{0x01}, std::byte{0x80}}) {
      cairn::bytes f = b.file;
      f[at] ^= mask;
      auto whole = cairn::check_index_file(f, where);
      INFO("byte " << at);
      REQUIRE(!whole);
      CHECK(whole.err().file == where);
      CHECK((whole.err().code == cairn::errc::corrupt ||
             whole.err().code == cairn::errc::unsupported_version));
      for (const auto& s : b.sections) {
        if (at < s.offset || at >= s.offset + s.length) continue;
        auto r =
            cairn::read_index_section(std::span(f).subspan(s.offset, s.length), s, where, block, 2);
        REQUIRE(!r);
        CHECK(r.err().code == cairn::errc::corrupt);
        CHECK(r.err().file == where);
        CHECK(r.err().offset.has_value());
      }
    }
  }
}

TEST_CASE(
    "index file: a rewritten section with a matching checksum is still checked field by "
    "field") {
  // Whoever can rewrite the file can rewrite the checksum the manifest holds: parsing must then
  // refuse what does not fit (or accept something consistent), never crash or over-allocate.
  built b = build();
  int refused = 0, accepted = 0;
  for (const auto& s0 : b.sections) {
    for (std::size_t at = s0.offset; at < s0.offset + s0.length; ++at) {
      for (std::uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        cairn::bytes f = b.file;
        f[at] = std::byte{v};
        cairn::index_section s = s0;
        auto sec = std::span<const std::byte>(f).subspan(s.offset, s.length);
        s.checksum = cairn::checksum(sec);
        auto r = cairn::read_index_section(sec, s, where, block, 2);
        if (!r) {
          ++refused;
          CHECK(r.err().code == cairn::errc::corrupt);
          CHECK(r.err().file == where);
          REQUIRE(r.err().offset.has_value());
          CHECK(*r.err().offset >= s.offset);
          CHECK(*r.err().offset <= s.offset + s.length);
          continue;
        }
        ++accepted;
        for (const auto& c : r->second.chunks) {  // what is accepted is consistent
          CHECK(c.where.file < 2);
          CHECK(c.where.nbytes ==
                static_cast<std::uint64_t>(c.region.volume()) * cairn::dtype_size(r->second.type));
          for (std::size_t a = 0; a < c.region.size.size(); ++a)
            CHECK(c.region.offset[a] + c.region.size[a] <= r->second.global_shape[a]);
        }
      }
    }
  }
  CHECK(refused > 0);
  CHECK(accepted > 0);  // e.g. a changed checksum value or byte offset parses
}

TEST_CASE("index file: truncations and lying counts are refused") {
  built b = build();
  for (std::size_t n = 0; n < b.file.size(); ++n)
    CHECK(!cairn::check_index_file(std::span(b.file).first(n), where));
  const auto& s = b.sections[0];
  for (std::size_t n = 0; n < s.length; ++n) {
    auto sec = std::span(b.file).subspan(s.offset, n);
    cairn::index_section t = s;
    t.length = n;
    t.checksum = cairn::checksum(sec);
    CHECK(!cairn::read_index_section(sec, t, where, block, 2));
  }
  // A section claiming 2^60 chunks in a few bytes: refused before allocating anything.
  cairn::bytes sec;
  cairn::tensor_record t{cairn::dtype::f32, {4}, {}};
  cairn::append_index_section(sec, "w", t);
  std::uint64_t lie = std::uint64_t{1} << 60;
  std::memcpy(sec.data() + sec.size() - 8, &lie, 8);
  cairn::index_section d{"w", 0, sec.size(), cairn::checksum(sec)};
  auto r = cairn::read_index_section(sec, d, where, block, 1);
  REQUIRE(!r);
  CHECK(r.err().message.find("chunk count") != std::string::npos);
  // The manifest names another key than the section: refused.
  cairn::index_section other{"v", 0, sec.size(), cairn::checksum(sec)};
  tensor_record good{cairn::dtype::f32, {4}, {}};
  cairn::bytes sec2;
  cairn::append_index_section(sec2, "w", good);
  other.length = sec2.size();
  other.checksum = cairn::checksum(sec2);
  CHECK(!cairn::read_index_section(sec2, other, where, block, 1));
}
