// cairn/format/torch/zip-inl.hpp: the bodies of cairn/format/torch/zip.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <map>
#include <memory>

#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/torch/zip.hpp"

namespace cairn::torch_zip::detail {

CAIRN_INLINE const std::array<std::array<std::uint32_t, 256>, 8>& crc_tables() {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    return t;
  }();
  return tables;
}

}  // namespace cairn::torch_zip::detail

namespace cairn::torch_zip {

CAIRN_INLINE std::uint32_t crc32(std::uint32_t crc, std::span<const std::byte> data) noexcept {
  const auto& t = detail::crc_tables();
  crc = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t n = data.size();
  while (n >= 8) {  // slicing-by-8
    std::uint32_t a = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 |
                             std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
    crc = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^
          t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

CAIRN_INLINE result<void> zip_writer::begin(std::string name, std::uint64_t size) {
  if (open_)
    return format_detail::fail(errc::invalid_argument, "zip: record still open", file_, name);
  entry e;
  e.name = std::move(name);
  e.size = size;
  e.header_offset = cursor_;
  bool z64 = size >= 0xFFFFFFFFu;
  std::uint64_t start = cursor_ + 30 + e.name.size() + 4 + (z64 ? 20 : 0);
  std::uint64_t pad = (record_alignment - start % record_alignment) % record_alignment;
  e.extra_len = static_cast<std::uint16_t>(4 + pad + (z64 ? 20 : 0));
  e.data_offset = start + pad;
  cursor_ = e.data_offset;
  entries_.push_back(std::move(e));
  open_ = true;
  written_ = 0;
  crc_ = 0;
  return ok();
}

CAIRN_INLINE result<void> zip_writer::append(std::span<const std::byte> data) {
  entry& e = entries_.back();
  if (!open_ || data.size() > e.size - written_)
    return format_detail::fail(errc::invalid_argument, "zip: more bytes than the record declared",
                               file_, e.name, base_ + cursor_);
  if (!data.empty()) CAIRN_TRY(out_->write_at(base_ + cursor_, data));
  crc_ = crc32(crc_, data);
  cursor_ += data.size();
  written_ += data.size();
  return ok();
}

CAIRN_INLINE result<void> zip_writer::end() {
  entry& e = entries_.back();
  if (!open_ || written_ != e.size)
    return format_detail::fail(
        errc::invalid_argument,
        "zip: record got " + std::to_string(written_) + " of " + std::to_string(e.size) + " bytes",
        file_, e.name);
  open_ = false;
  e.crc = crc_;
  std::string h;
  bool z64 = e.size >= 0xFFFFFFFFu;
  format_detail::put_le(h, 0x04034b50, 4);
  format_detail::put_le(h, z64 ? 45 : 20, 2);  // version needed
  format_detail::put_le(h, 0, 2);              // flags
  format_detail::put_le(h, 0, 2);              // stored
  format_detail::put_le(h, 0, 4);              // time, date
  format_detail::put_le(h, e.crc, 4);
  format_detail::put_le(h, z64 ? 0xFFFFFFFFu : e.size, 4);
  format_detail::put_le(h, z64 ? 0xFFFFFFFFu : e.size, 4);
  format_detail::put_le(h, e.name.size(), 2);
  format_detail::put_le(h, e.extra_len, 2);
  h += e.name;
  if (z64) {
    format_detail::put_le(h, 0x0001, 2);
    format_detail::put_le(h, 16, 2);
    format_detail::put_le(h, e.size, 8);
    format_detail::put_le(h, e.size, 8);
  }
  std::size_t pad = e.extra_len - 4 - (z64 ? 20 : 0);
  format_detail::put_le(h, 0x4246, 2);  // "FB"
  format_detail::put_le(h, pad, 2);
  h.append(pad, 'Z');
  return out_->write_at(base_ + e.header_offset, format_detail::as_bytes(h));
}

CAIRN_INLINE result<void> zip_writer::add(std::string name, std::span<const std::byte> data) {
  CAIRN_TRY(begin(std::move(name), data.size()));
  CAIRN_TRY(append(data));
  return end();
}

CAIRN_INLINE result<std::uint64_t> zip_writer::finish() {
  if (open_)
    return format_detail::fail(errc::invalid_argument, "zip: record still open", file_,
                               entries_.back().name);
  std::string cd;
  for (const entry& e : entries_) {
    bool zs = e.size >= 0xFFFFFFFFu, zo = e.header_offset >= 0xFFFFFFFFu;
    std::string extra;
    if (zs || zo) {
      format_detail::put_le(extra, 0x0001, 2);
      format_detail::put_le(extra, (zs ? 16 : 0) + (zo ? 8 : 0), 2);
      if (zs) {
        format_detail::put_le(extra, e.size, 8);
        format_detail::put_le(extra, e.size, 8);
      }
      if (zo) format_detail::put_le(extra, e.header_offset, 8);
    }
    format_detail::put_le(cd, 0x02014b50, 4);
    format_detail::put_le(cd, (zs || zo) ? 45 : 20, 2);  // made by
    format_detail::put_le(cd, (zs || zo) ? 45 : 20, 2);  // needed
    format_detail::put_le(cd, 0, 2);
    format_detail::put_le(cd, 0, 2);
    format_detail::put_le(cd, 0, 4);
    format_detail::put_le(cd, e.crc, 4);
    format_detail::put_le(cd, zs ? 0xFFFFFFFFu : e.size, 4);
    format_detail::put_le(cd, zs ? 0xFFFFFFFFu : e.size, 4);
    format_detail::put_le(cd, e.name.size(), 2);
    format_detail::put_le(cd, extra.size(), 2);
    format_detail::put_le(cd, 0, 2);  // comment
    format_detail::put_le(cd, 0, 2);  // disk
    format_detail::put_le(cd, 0, 2);  // internal attributes
    format_detail::put_le(cd, 0, 4);  // external attributes
    format_detail::put_le(cd, zo ? 0xFFFFFFFFu : e.header_offset, 4);
    cd += e.name;
    cd += extra;
  }
  std::uint64_t cd_offset = cursor_, n = entries_.size();
  bool z64 = n >= 0xFFFF || cd_offset >= 0xFFFFFFFFu || cd.size() >= 0xFFFFFFFFu;
  std::string tail = cd;
  if (z64) {
    std::uint64_t eocd64 = cd_offset + cd.size();
    format_detail::put_le(tail, 0x06064b50, 4);
    format_detail::put_le(tail, 44, 8);
    format_detail::put_le(tail, 45, 2);
    format_detail::put_le(tail, 45, 2);
    format_detail::put_le(tail, 0, 4);
    format_detail::put_le(tail, 0, 4);
    format_detail::put_le(tail, n, 8);
    format_detail::put_le(tail, n, 8);
    format_detail::put_le(tail, cd.size(), 8);
    format_detail::put_le(tail, cd_offset, 8);
    format_detail::put_le(tail, 0x07064b50, 4);
    format_detail::put_le(tail, 0, 4);
    format_detail::put_le(tail, eocd64, 8);
    format_detail::put_le(tail, 1, 4);
  }
  format_detail::put_le(tail, 0x06054b50, 4);
  format_detail::put_le(tail, 0, 4);
  format_detail::put_le(tail, z64 ? 0xFFFF : n, 2);
  format_detail::put_le(tail, z64 ? 0xFFFF : n, 2);
  format_detail::put_le(tail, z64 ? 0xFFFFFFFFu : cd.size(), 4);
  format_detail::put_le(tail, z64 ? 0xFFFFFFFFu : cd_offset, 4);
  format_detail::put_le(tail, 0, 2);
  CAIRN_TRY(out_->write_at(base_ + cursor_, format_detail::as_bytes(tail)));
  cursor_ += tail.size();
  return cursor_;
}

CAIRN_INLINE const record* zip_archive::find(std::string_view name) const noexcept {
  for (const auto& r : records)
    if (r.name == name) return &r;
  return nullptr;
}

CAIRN_INLINE result<void> zip_archive::read(const record& r,
                                            std::uint64_t offset,
                                            std::span<std::byte> out) const {
  if (offset > r.size || out.size() > r.size - offset)
    return format_detail::fail(errc::invalid_argument, "zip: read past the end of the record", file,
                               r.name, base + r.data_offset + offset);
  if (out.empty()) return ok();
  return st.read(object, base + r.data_offset + offset, out);
}

CAIRN_INLINE result<std::vector<std::byte>> zip_archive::read_all(const record& r) const {
  CAIRN_TRY_ASSIGN(std::vector<std::byte> buf, format_detail::buffer(r.size, file, r.name));
  CAIRN_TRY(read(r, 0, buf));
  if (crc32(0, buf) != r.crc)
    return format_detail::corrupt("zip: CRC-32 mismatch", file, r.name, base + r.data_offset);
  return buf;
}

}  // namespace cairn::torch_zip

namespace cairn::torch_zip::detail {

CAIRN_INLINE result<void> read_zip64_end(const zip_archive& z,
                                         std::uint64_t z64,
                                         central_directory& d) {
  using format_detail::load_le;
  if (z64 > z.length || 56 > z.length - z64)
    return format_detail::corrupt("zip: bad zip64 locator", z.file, {}, z.base + d.eocd_pos - 20);
  CAIRN_TRY_ASSIGN(auto r, format_detail::read_bytes(z.st, z.object, z.base + z64, 56));
  if (load_le(r.data(), 4) != 0x06064b50)
    return format_detail::corrupt("zip: bad zip64 end record", z.file, {}, z.base + z64);
  d.entries = load_le(r.data() + 32, 8);
  d.size = load_le(r.data() + 40, 8);
  d.offset = load_le(r.data() + 48, 8);
  return ok();
}

CAIRN_INLINE result<central_directory> read_end_records(const zip_archive& z) {
  using format_detail::load_le;
  std::uint64_t tail_len = std::min<std::uint64_t>(z.length, 22 + 65535 + 20);
  // Reading the last bytes also proves that the object holds `[base, base + length)`: a read
  // past its end fails, so every size below, once checked against `length`, is backed by data.
  CAIRN_TRY_ASSIGN(
      auto tail, format_detail::read_bytes(z.st, z.object, z.base + z.length - tail_len, tail_len));
  std::int64_t at = -1;
  for (std::int64_t p = static_cast<std::int64_t>(tail_len) - 22; p >= 0; --p)
    if (load_le(tail.data() + p, 4) == 0x06054b50) {
      at = p;
      break;
    }
  if (at < 0)
    return format_detail::corrupt("zip: no end-of-central-directory record", z.file, {},
                                  z.base + z.length);
  const std::byte* e = tail.data() + at;
  central_directory d;
  d.entries = load_le(e + 10, 2);
  d.size = load_le(e + 12, 4);
  d.offset = load_le(e + 16, 4);
  d.eocd_pos = z.length - tail_len + static_cast<std::uint64_t>(at);
  if ((d.entries == 0xFFFF || d.size == 0xFFFFFFFFu || d.offset == 0xFFFFFFFFu) && at >= 20 &&
      load_le(e - 20, 4) == 0x07064b50) {
    CAIRN_TRY(read_zip64_end(z, load_le(e - 12, 8), d));
  }
  if (d.offset > z.length || d.size > z.length - d.offset)
    return format_detail::corrupt("zip: central directory out of bounds", z.file, {},
                                  z.base + d.eocd_pos);
  return d;
}

CAIRN_INLINE void apply_zip64_extra(const std::byte* x,
                                    std::uint64_t xlen,
                                    std::uint64_t& usize,
                                    std::uint64_t& csize,
                                    std::uint64_t& off) {
  using format_detail::load_le;
  for (std::size_t q = 0; q + 4 <= xlen;) {
    std::uint64_t id = load_le(x + q, 2), len = load_le(x + q + 2, 2);
    if (q + 4 + len > xlen) break;
    if (id == 0x0001) {
      std::size_t f = q + 4;
      auto next = [&](std::uint64_t& v) {
        if (v == 0xFFFFFFFFu && f + 8 <= q + 4 + len) {
          v = load_le(x + f, 8);
          f += 8;
        }
      };
      next(usize);
      next(csize);
      next(off);
    }
    q += 4 + len;
  }
}

CAIRN_INLINE result<std::uint64_t> local_data_offset(const zip_archive& z,
                                                     std::uint64_t off,
                                                     const std::string& name,
                                                     std::uint64_t where) {
  using format_detail::load_le;
  if (off > z.length || 30 > z.length - off)
    return format_detail::corrupt("zip: local header out of bounds", z.file, name, where);
  CAIRN_TRY_ASSIGN(auto lh, format_detail::read_bytes(z.st, z.object, z.base + off, 30));
  if (load_le(lh.data(), 4) != 0x04034b50)
    return format_detail::corrupt("zip: bad local header signature", z.file, name, z.base + off);
  return off + 30 + load_le(lh.data() + 26, 2) + load_le(lh.data() + 28, 2);
}

CAIRN_INLINE result<record> read_central_entry(const zip_archive& z,
                                               const std::vector<std::byte>& cd,
                                               std::uint64_t cd_off,
                                               std::size_t& p) {
  using format_detail::load_le;
  const std::string& file = z.file;
  std::uint64_t where = z.base + cd_off + p;
  if (p + 46 > cd.size() || load_le(cd.data() + p, 4) != 0x02014b50)
    return format_detail::corrupt("zip: bad central directory entry", file, {}, where);
  const std::byte* c = cd.data() + p;
  std::uint64_t method = load_le(c + 10, 2), crc = load_le(c + 16, 4), csize = load_le(c + 20, 4),
                usize = load_le(c + 24, 4), nlen = load_le(c + 28, 2), xlen = load_le(c + 30, 2),
                clen = load_le(c + 32, 2), off = load_le(c + 42, 4);
  if (p + 46 + nlen + xlen + clen > cd.size())
    return format_detail::corrupt("zip: central directory entry overruns", file, {}, where);
  record r;
  r.name.assign(reinterpret_cast<const char*>(c + 46), nlen);
  r.crc = static_cast<std::uint32_t>(crc);
  apply_zip64_extra(c + 46 + nlen, xlen, usize, csize, off);
  if (method != 0)
    return format_detail::corrupt("zip: record is compressed (method " + std::to_string(method) +
                                      "); only stored records are supported",
                                  file, r.name, where);
  if (csize != usize)
    return format_detail::corrupt("zip: stored record sizes differ", file, r.name, where);
  CAIRN_TRY_ASSIGN(r.data_offset, local_data_offset(z, off, r.name, where));
  r.size = usize;
  if (r.data_offset > z.length || r.size > z.length - r.data_offset)
    return format_detail::corrupt("zip: record data out of bounds", file, r.name, z.base + off);
  p += 46 + nlen + xlen + clen;
  return r;
}

}  // namespace cairn::torch_zip::detail

namespace cairn::torch_zip {

CAIRN_INLINE result<zip_archive> open_zip(storage_ref st,
                                          std::string_view object,
                                          std::uint64_t base,
                                          std::uint64_t length) {
  zip_archive z{st, std::string(object), base, length, st.describe(object), {}};
  const std::string& file = z.file;
  if (length == 0) {
    CAIRN_TRY_ASSIGN(std::uint64_t size, st.size(object));
    if (size < base)
      return format_detail::corrupt("zip: archive starts past the end", file, {}, base);
    z.length = length = size - base;
  }
  if (length < 22) return format_detail::corrupt("zip: too short for an archive", file, {}, base);
  if (!format_detail::add(base, length))
    return format_detail::corrupt("zip: archive range overflows", file, {}, base);
  CAIRN_TRY_ASSIGN(detail::central_directory d, detail::read_end_records(z));
  CAIRN_TRY_ASSIGN(auto cd, format_detail::read_bytes(st, object, base + d.offset, d.size));
  std::size_t p = 0;
  for (std::uint64_t i = 0; i < d.entries; ++i) {
    CAIRN_TRY_ASSIGN(record r, detail::read_central_entry(z, cd, d.offset, p));
    z.records.push_back(std::move(r));
  }
  return z;
}

CAIRN_INLINE std::optional<dtype> dtype_from_torch_name(std::string_view n) noexcept {
  for (dtype t : all_dtypes)
    if (torch_dtype_name(t) == n) return t;
  static constexpr std::pair<std::string_view, dtype> aliases[] = {
      {"float", dtype::f32}, {"double", dtype::f64}, {"half", dtype::f16},
      {"long", dtype::i64},  {"int", dtype::i32},    {"short", dtype::i16}};
  for (auto [a, t] : aliases)
    if (a == n) return t;
  return std::nullopt;
}

CAIRN_INLINE std::optional<dtype> dtype_from_storage_class(std::string_view n) noexcept {
  for (dtype t : all_dtypes)
    if (!storage_class(t).empty() && storage_class(t) == n) return t;
  return std::nullopt;
}

CAIRN_INLINE pickle::value tensor_value(dtype type,
                                        const shape& dims,
                                        std::string storage_key,
                                        std::int64_t storage_numel,
                                        std::int64_t storage_offset) {
  using pickle::value;
  std::vector<value> sizes, strides(dims.size());
  std::int64_t stride = 1;
  for (std::size_t a = dims.size(); a-- > 0;) {
    strides[a] = value::integer(stride);
    stride *= std::max<std::int64_t>(dims[a], 1);
  }
  for (auto d : dims) sizes.push_back(value::integer(d));
  bool legacy = !storage_class(type).empty();
  value pid = value::tuple(
      {value::string("storage"),
       // torch pickles UntypedStorage by its module, torch.storage: the name that
       // torch.load(weights_only=True) allows.
       legacy ? value::global("torch", std::string(storage_class(type)))
              : value::global("torch.storage", "UntypedStorage"),
       value::string(std::move(storage_key)), value::string("cpu"),
       value::integer(legacy ? storage_numel
                             : storage_numel * static_cast<std::int64_t>(dtype_size(type)))});
  value hooks = value::instance("collections", "OrderedDict", value::tuple(), value(), false);
  std::vector<value> args{value::persistent(std::move(pid)),
                          value::integer(storage_offset),
                          value::tuple(std::move(sizes)),
                          value::tuple(std::move(strides)),
                          value::boolean(false),
                          std::move(hooks)};
  if (!legacy) args.push_back(value::global("torch", std::string(torch_dtype_name(type))));
  return value::instance("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3",
                         value::tuple(std::move(args)), value(), false);
}

namespace detail {

/// `write_archive` with storage i written by `add_storage(z, record name, i)`.
template <class AddStorage>
result<std::uint64_t> write_archive_with(object_writer& out,
                                         std::uint64_t base,
                                         std::string_view prefix,
                                         const pickle::value& root,
                                         std::size_t storages,
                                         AddStorage&& add_storage,
                                         std::string file) {
  zip_writer z(out, base, std::move(file));
  std::string p(prefix);
  std::string pkl = pickle::dumps(root, 2);
  CAIRN_TRY(z.add(p + "/data.pkl", format_detail::as_bytes(pkl)));
  CAIRN_TRY(z.add(p + "/.format_version", format_detail::as_bytes("1")));
  CAIRN_TRY(z.add(p + "/.storage_alignment", format_detail::as_bytes("64")));
  CAIRN_TRY(z.add(p + "/byteorder", format_detail::as_bytes("little")));
  for (std::size_t i = 0; i < storages; ++i)
    CAIRN_TRY(add_storage(z, p + "/data/" + std::to_string(i), i));
  CAIRN_TRY(z.add(p + "/version", format_detail::as_bytes("3\n")));
  return z.finish();
}

}  // namespace detail

CAIRN_INLINE result<std::uint64_t> write_archive(
    object_writer& out,
    std::uint64_t base,
    std::string_view prefix,
    const pickle::value& root,
    std::span<const std::span<const std::byte>> storages,
    std::string file) {
  return detail::write_archive_with(
      out, base, prefix, root, storages.size(),
      [&](zip_writer& z, std::string name, std::size_t i) {
        return z.add(std::move(name), storages[i]);
      },
      std::move(file));
}

CAIRN_INLINE result<std::uint64_t> write_tensor_item(object_writer& out,
                                                     std::uint64_t base,
                                                     const tensor_view& t,
                                                     std::string file) {
  // The bytes in memory are a stream of one piece.
  return write_tensor_item(
      out, base, t, t.data.size(),
      [&](const std::function<result<void>(std::span<const std::byte>)>& append) {
        return append(t.data);
      },
      std::move(file));
}

CAIRN_INLINE result<std::uint64_t> write_tensor_item(object_writer& out,
                                                     std::uint64_t base,
                                                     const tensor_view& t,
                                                     std::uint64_t nbytes,
                                                     const byte_stream& fill,
                                                     std::string file) {
  std::int64_t n = numel(t.dims);
  if (nbytes != static_cast<std::uint64_t>(n) * dtype_size(t.type))
    return format_detail::fail(errc::invalid_argument,
                               "torch.save: tensor bytes do not match shape", file, t.name);
  pickle::value root = tensor_value(t.type, t.dims, "0", n);
  return detail::write_archive_with(
      out, base, "archive", root, 1,
      [&](zip_writer& z, std::string name, std::size_t) -> result<void> {
        CAIRN_TRY(z.begin(std::move(name), nbytes));
        CAIRN_TRY(fill([&](std::span<const std::byte> piece) { return z.append(piece); }));
        return z.end();
      },
      std::move(file));
}

CAIRN_INLINE result<void> write_pt(storage_ref st,
                                   std::string_view name,
                                   const std::vector<tensor_view>& tensors) {
  std::vector<std::pair<pickle::value, pickle::value>> entries;
  std::vector<std::span<const std::byte>> storages;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::int64_t n = numel(t.dims);
    if (t.data.size() != static_cast<std::size_t>(n) * dtype_size(t.type))
      return format_detail::fail(errc::invalid_argument,
                                 "torch.save: tensor bytes do not match shape", st.describe(name),
                                 t.name);
    entries.emplace_back(pickle::value::string(t.name),
                         tensor_value(t.type, t.dims, std::to_string(i), n));
    storages.push_back(t.data);
  }
  std::string_view base = name.substr(name.find_last_of('/') + 1);
  std::string prefix(base.substr(0, base.find_last_of('.')));
  if (prefix.empty()) prefix = "archive";
  CAIRN_TRY_ASSIGN(auto out, st.open_writer(name));
  CAIRN_TRY(write_archive(*out, 0, prefix, pickle::value::dict(std::move(entries)), storages,
                          st.describe(name)));
  return out->finish();
}

CAIRN_INLINE result<archive> open_archive(storage_ref st,
                                          std::string_view object,
                                          std::uint64_t base,
                                          std::uint64_t length) {
  CAIRN_TRY_ASSIGN(zip_archive z, open_zip(st, object, base, length));
  if (z.records.empty())
    return format_detail::corrupt("torch.save: empty archive", z.file, {}, base);
  std::string prefix = z.records[0].name.substr(0, z.records[0].name.find('/'));
  for (const auto& r : z.records)
    if (r.name.compare(0, prefix.size() + 1, prefix + "/") != 0)
      return format_detail::corrupt("torch.save: records do not share the folder '" + prefix + "'",
                                    z.file, r.name, base + r.data_offset);
  const record* ver = z.find(prefix + "/.data/version");
  if (!ver) ver = z.find(prefix + "/version");
  if (!ver) return format_detail::corrupt("torch.save: no version record", z.file, prefix, base);
  for (const record* small : {ver, z.find(prefix + "/byteorder")})
    if (small && small->size > 64)
      return format_detail::corrupt(
          "torch.save: " + std::to_string(small->size) + "-byte record where a word is expected",
          z.file, small->name, base + small->data_offset);
  CAIRN_TRY_ASSIGN(auto vb, z.read_all(*ver));
  std::string vs(reinterpret_cast<const char*>(vb.data()), vb.size());
  long v = std::strtol(vs.c_str(), nullptr, 10);
  if (v < 1 || v > 10)
    return format_detail::fail(errc::unsupported_version,
                               "torch.save: unsupported version '" + vs + "'", z.file, ver->name,
                               base + ver->data_offset);
  if (const record* bo = z.find(prefix + "/byteorder")) {
    CAIRN_TRY_ASSIGN(auto b, z.read_all(*bo));
    if (std::string_view(reinterpret_cast<const char*>(b.data()), b.size()) != "little")
      return format_detail::fail(errc::unsupported_version, "torch.save: big-endian archive",
                                 z.file, bo->name, base + bo->data_offset);
  }
  const record* pkl = z.find(prefix + "/data.pkl");
  if (!pkl) return format_detail::corrupt("torch.save: no data.pkl", z.file, prefix, base);
  CAIRN_TRY_ASSIGN(auto pb, z.read_all(*pkl));
  auto root = pickle::load(pb, z.file);
  if (!root) {
    error e = std::move(root).err();
    e.key = pkl->name;
    if (e.offset) *e.offset += base + pkl->data_offset;
    return e;
  }
  return archive{std::move(z), std::move(prefix), std::move(root).value()};
}

}  // namespace cairn::torch_zip

namespace cairn::torch_zip::detail {

CAIRN_INLINE bool valid_view(const shape& dims,
                             const shape& strides,
                             std::int64_t storage_offset,
                             std::size_t elem_size) noexcept {
  if (dims.size() != strides.size() || storage_offset < 0 || storage_offset > max_tensor_bytes ||
      !format_detail::file_numel(dims, elem_size))
    return false;
  for (auto s : strides)
    if (s < 0 || s > max_tensor_bytes) return false;
  return true;
}

CAIRN_INLINE std::optional<std::uint64_t> view_last_element(const tensor_ref& t) noexcept {
  unsigned __int128 hi = static_cast<std::uint64_t>(t.storage_offset);
  for (std::size_t d = 0; d < t.dims.size(); ++d)
    hi += static_cast<unsigned __int128>(t.dims[d] - 1) * static_cast<std::uint64_t>(t.strides[d]);
  if (hi > static_cast<std::uint64_t>(max_tensor_bytes)) return std::nullopt;
  return static_cast<std::uint64_t>(hi);
}

}  // namespace cairn::torch_zip::detail

namespace cairn::torch_zip {

CAIRN_INLINE std::optional<tensor_ref> as_tensor(const pickle::value& v) {
  using K = pickle::value::kind;
  // A Parameter wraps its tensor in its first argument. A few levels at most: a value loaded
  // from a file cannot contain itself, but one built by hand could.
  const pickle::value* p = &v;
  for (int level = 0;; ++level) {
    if (!p->is_object()) return std::nullopt;
    const pickle::object& o = *p->obj;
    bool param = o.is("torch._utils", "_rebuild_parameter") ||
                 o.is("torch._utils", "_rebuild_parameter_with_state") ||
                 o.is("torch.nn.parameter", "Parameter");
    if (!param) break;
    if (o.args.elements().empty() || level == 4) return std::nullopt;
    p = &o.args.elements()[0];
  }
  const pickle::object& o = *p->obj;
  const auto& a = o.args.elements();
  bool v2 = o.is("torch._utils", "_rebuild_tensor_v2"),
       v3 = o.is("torch._utils", "_rebuild_tensor_v3");
  if (!(v2 || v3) || a.size() < 4 || a[0].type != K::persistent_id || a[0].elements().empty())
    return std::nullopt;
  const auto& pid = a[0].elements()[0].elements();
  if (pid.size() < 5 || pid[0].str != "storage" || pid[1].type != K::global) return std::nullopt;
  tensor_ref t;
  if (v3) {
    if (a.size() < 7 || a[6].type != K::global) return std::nullopt;
    auto d = dtype_from_torch_name(a[6].name);
    if (!d) return std::nullopt;
    t.type = *d;
  } else {
    auto d = dtype_from_storage_class(pid[1].name);
    if (!d) return std::nullopt;
    t.type = *d;
  }
  if (pid[2].type == K::string)
    t.storage_key = pid[2].str;
  else if (pid[2].type == K::integer)
    t.storage_key = std::to_string(pid[2].i);
  else
    return std::nullopt;
  if (!a[1].is_int() || !a[2].is_sequence() || !a[3].is_sequence()) return std::nullopt;
  t.storage_offset = a[1].i;
  for (const auto& x : a[2].elements()) {
    if (!x.is_int()) return std::nullopt;
    t.dims.push_back(x.i);
  }
  for (const auto& x : a[3].elements()) {
    if (!x.is_int()) return std::nullopt;
    t.strides.push_back(x.i);
  }
  if (!detail::valid_view(t.dims, t.strides, t.storage_offset, dtype_size(t.type)))
    return std::nullopt;
  return t;
}

CAIRN_INLINE std::vector<std::pair<std::string, tensor_ref>> find_tensors(
    const pickle::value& root) {
  std::vector<std::pair<std::string, tensor_ref>> out;
  std::uint64_t path_bytes = 0;
  struct frame {
    const pickle::value* v;
    std::string path;
    std::size_t next = 0;
  };
  auto key_of = [](const pickle::value& k) { return k.is_string() ? k.str : std::to_string(k.i); };
  // The next child of frame `f` and its key, or nullptr when it has no more.
  auto next_child = [&](frame& f, std::string& key) -> const pickle::value* {
    const pickle::value& v = *f.v;
    if (v.is_dict()) {
      if (f.next >= v.entries->size()) return nullptr;
      const auto& e = (*v.entries)[f.next++];
      key = key_of(e.first);
      return &e.second;
    }
    if (v.is_sequence()) {
      if (f.next >= v.elements().size()) return nullptr;
      key = std::to_string(f.next);
      return &v.elements()[f.next++];
    }
    if (v.is_object()) {  // OrderedDict(...) with SETITEMS, or BUILD dict state
      if (f.next >= v.obj->dict_items.size()) return nullptr;
      const auto& e = v.obj->dict_items[f.next++];
      key = key_of(e.first);
      return &e.second;
    }
    return nullptr;
  };
  auto fail = [](std::string msg) {
    throw exception(make_error(errc::resource, "torch.save: " + std::move(msg)));
  };
  std::vector<frame> path;
  auto visit = [&](const pickle::value& v, std::string p) {
    if (auto t = as_tensor(v)) {
      path_bytes += p.size();
      if (path_bytes > max_found_path_bytes)
        fail("tensor paths exceed " + std::to_string(max_found_path_bytes) + " bytes");
      out.emplace_back(std::move(p), std::move(*t));
    } else if (v.is_dict() || v.is_sequence() || v.is_object()) {
      if (path.size() >= pickle::load_limits{}.max_depth)
        fail("containers nest deeper than " + std::to_string(pickle::load_limits{}.max_depth));
      path.push_back({&v, std::move(p)});
    }
  };
  visit(root, "");
  std::string key;
  while (!path.empty()) {
    const pickle::value* c = next_child(path.back(), key);
    if (!c) {
      path.pop_back();
      continue;
    }
    const std::string& p = path.back().path;
    visit(*c, p.empty() ? key : p + "." + key);
  }
  return out;
}

CAIRN_INLINE result<std::vector<std::byte>> read_tensor(const archive& a, const tensor_ref& t) {
  const std::string rec_name = a.prefix + "/data/" + t.storage_key;
  const record* r = a.zip.find(rec_name);
  if (!r) return format_detail::corrupt("torch.save: missing storage record", a.zip.file, rec_name);
  const std::size_t es = dtype_size(t.type);
  if (!detail::valid_view(t.dims, t.strides, t.storage_offset, es))
    return format_detail::corrupt(
        "torch.save: tensor sizes, strides or offset are negative or "
        "exceed 2^62 bytes",
        a.zip.file, rec_name, a.zip.base + r->data_offset);
  const std::int64_t n = numel(t.dims);
  const std::uint64_t bytes = static_cast<std::uint64_t>(n) * es;
  if (n == 0) return std::vector<std::byte>();
  // Element range touched by the view, to bound-check and read once.
  const auto lo = static_cast<std::uint64_t>(t.storage_offset);
  const auto hi = detail::view_last_element(t);
  if (!hi || *hi >= r->size / es)
    return format_detail::corrupt(
        "torch.save: tensor view exceeds its storage (" + std::to_string(r->size) + " bytes)",
        a.zip.file, rec_name, a.zip.base + r->data_offset);
  if (bytes > r->size && bytes > max_expanded_view_bytes)
    return format_detail::fail(errc::resource,
                               "torch.save: a view of " + std::to_string(bytes) +
                                   " bytes over a storage of " + std::to_string(r->size) +
                                   " bytes (overlapping strides) is not materialized",
                               a.zip.file, rec_name, a.zip.base + r->data_offset);
  CAIRN_TRY_ASSIGN(std::vector<std::byte> buf,
                   format_detail::buffer((*hi - lo + 1) * es, a.zip.file, rec_name));
  CAIRN_TRY(a.zip.read(*r, lo * es, buf));
  bool contiguous = true;
  for (std::int64_t d = static_cast<std::int64_t>(t.dims.size()) - 1, s = 1; d >= 0; --d) {
    if (t.dims[d] != 1 && t.strides[d] != s) contiguous = false;
    s *= t.dims[d];
  }
  if (contiguous) return buf;
  CAIRN_TRY_ASSIGN(std::vector<std::byte> out, format_detail::buffer(bytes, a.zip.file, rec_name));
  std::vector<std::int64_t> idx(t.dims.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t src = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) src += idx[d] * t.strides[d];
    std::memcpy(out.data() + static_cast<std::size_t>(i) * es,
                buf.data() + static_cast<std::size_t>(src) * es, es);
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.dims[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace cairn::torch_zip
