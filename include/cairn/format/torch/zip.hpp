// cairn/format/torch/zip.hpp: the `torch.save` zip layout — a stored (uncompressed) ZIP writer
// with torch's 64-byte data alignment and zip64 when needed, a ZIP reader over any storage
// backend (also for archives embedded in a larger file, as DCP's `.distcp` items are), and
// `data.pkl` helpers to write and read tensors. Byte layout notes in docs/torch-formats.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::torch_zip {

// --- CRC-32 (ZIP / zlib polynomial 0xEDB88320) ---------------------------------------------------

namespace detail {
CAIRN_INLINE const std::array<std::array<std::uint32_t, 256>, 8>& crc_tables();
}  // namespace detail

/// Continues a CRC-32 over `data` (start with `crc = 0`).
CAIRN_INLINE std::uint32_t crc32(std::uint32_t crc, std::span<const std::byte> data) noexcept;

// --- ZIP writer ----------------------------------------------------------------------------------

/// Alignment of every record's payload, as PyTorchStreamWriter pads it.
inline constexpr std::uint64_t record_alignment = 64;

/// Writes a stored ZIP archive into an `object_writer` starting at byte `base` (so archives can
/// be concatenated in one file, as in `.distcp`). Offsets inside the archive are relative to
/// `base`. Each record's payload starts on a 64-byte boundary (torch's "FB" padding extra field);
/// records of 4 GiB or more, and archives past 4 GiB, get ZIP64 fields. A record's bytes may be
/// streamed (`begin`, `append`..., `end`): its local header is written last, once the CRC is
/// known, so memory stays bounded by what the caller passes.
class zip_writer {
 public:
  /// `file` names the output in errors.
  zip_writer(object_writer& out, std::uint64_t base = 0, std::string file = {})
      : out_(&out), base_(base), file_(std::move(file)) {}

  /// Starts record `name` of exactly `size` bytes.
  result<void> begin(std::string name, std::uint64_t size);
  /// Appends bytes to the open record.
  result<void> append(std::span<const std::byte> data);
  /// Ends the open record: writes its local header.
  result<void> end();
  /// Writes a whole record.
  result<void> add(std::string name, std::span<const std::byte> data);
  /// Writes the central directory and end records; returns the archive's total size. Does not
  /// finish the `object_writer`.
  result<std::uint64_t> finish();

 private:
  struct entry {
    std::string name;
    std::uint64_t size = 0, header_offset = 0, data_offset = 0;
    std::uint16_t extra_len = 0;
    std::uint32_t crc = 0;
  };
  object_writer* out_;
  std::uint64_t base_;
  std::string file_;
  std::vector<entry> entries_;
  std::uint64_t cursor_ = 0, written_ = 0;
  std::uint32_t crc_ = 0;
  bool open_ = false;
};

// --- ZIP reader ----------------------------------------------------------------------------------

/// A record of an archive: where its stored bytes are, relative to the archive start.
struct record {
  std::string name;
  std::uint64_t data_offset = 0;  ///< payload start, relative to the archive's base
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
};

/// A ZIP archive read through `storage_ref` from object `object` at bytes
/// `[base, base + length)`. Only stored (uncompressed) records can be read.
struct zip_archive {
  storage_ref st;
  std::string object;
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  std::string file;             ///< describe(object), for errors
  std::vector<record> records;  ///< in central-directory order

  /// The record named `name`, or nullptr.
  const record* find(std::string_view name) const noexcept;
  /// Reads `out.size()` bytes at `offset` inside record `r`.
  result<void> read(const record& r, std::uint64_t offset, std::span<std::byte> out) const;
  /// Reads a whole record, checking its CRC-32 (`errc::resource` when it does not fit in
  /// memory; its size was checked against the archive when it was opened).
  result<std::vector<std::byte>> read_all(const record& r) const;
};

namespace detail {

/// Where an archive's central directory is, as its end records say (relative to the archive).
struct central_directory {
  std::uint64_t entries = 0;   ///< number of records
  std::uint64_t size = 0;      ///< bytes of the directory
  std::uint64_t offset = 0;    ///< where the directory starts
  std::uint64_t eocd_pos = 0;  ///< where the end-of-central-directory record starts
};

/// Replaces `d`'s counts with those of the zip64 end record at `z64` (as the zip64 locator of
/// archive `z` says), which must lie inside the archive and carry its signature.
CAIRN_INLINE result<void> read_zip64_end(const zip_archive& z,
                                         std::uint64_t z64,
                                         central_directory& d);

/// Finds the end-of-central-directory record in the last bytes of archive `z` (of at least 22
/// bytes), follows its zip64 locator when a field overflows, and checks that the central
/// directory lies inside the archive.
CAIRN_INLINE result<central_directory> read_end_records(const zip_archive& z);

/// Applies the zip64 extra field found among the `xlen` bytes of extra fields at `x`: each of
/// `usize`, `csize` and `off` that is 0xFFFFFFFF, in that order, takes the next 64-bit value.
CAIRN_INLINE void apply_zip64_extra(const std::byte* x,
                                    std::uint64_t xlen,
                                    std::uint64_t& usize,
                                    std::uint64_t& csize,
                                    std::uint64_t& off);

/// Where the payload of record `name` starts in archive `z`, from its local header at `off`,
/// which must lie inside the archive and carry its signature. `where` locates the record's
/// central directory entry in errors.
CAIRN_INLINE result<std::uint64_t> local_data_offset(const zip_archive& z,
                                                     std::uint64_t off,
                                                     const std::string& name,
                                                     std::uint64_t where);

/// The record of the central directory entry at byte `p` of `cd` (the directory of archive `z`,
/// at `cd_off` in it): a stored record whose local header and data lie inside the archive.
/// Advances `p` past the entry.
CAIRN_INLINE result<record> read_central_entry(const zip_archive& z,
                                               const std::vector<std::byte>& cd,
                                               std::uint64_t cd_off,
                                               std::size_t& p);

}  // namespace detail

/// Opens the archive in `object` at `[base, base + length)`; `length == 0` means up to the end
/// of the object. Handles zip64; rejects compressed records with `errc::corrupt`. Every offset
/// and size in the archive is checked against `length` (and `length` against the object, by
/// reading the archive's end) before anything is allocated by it.
CAIRN_INLINE result<zip_archive> open_zip(storage_ref st,
                                          std::string_view object,
                                          std::uint64_t base = 0,
                                          std::uint64_t length = 0);

// --- torch.save: data.pkl and storages -----------------------------------------------------------

/// The legacy storage class torch uses for a dtype ("FloatStorage"), or "" when the dtype has
/// none (those use `_rebuild_tensor_v3` and `UntypedStorage`).
constexpr std::string_view storage_class(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "FloatStorage";
    case dtype::f64:
      return "DoubleStorage";
    case dtype::f16:
      return "HalfStorage";
    case dtype::bf16:
      return "BFloat16Storage";
    case dtype::i64:
      return "LongStorage";
    case dtype::i32:
      return "IntStorage";
    case dtype::i16:
      return "ShortStorage";
    case dtype::i8:
      return "CharStorage";
    case dtype::u8:
      return "ByteStorage";
    case dtype::bool_:
      return "BoolStorage";
    default:
      return "";
  }
}

/// torch's attribute name for a dtype ("float32", "float8_e4m3fn", "uint16").
constexpr std::string_view torch_dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
      return "bool";
    case dtype::u8:
      return "uint8";
    case dtype::i8:
      return "int8";
    case dtype::i16:
      return "int16";
    case dtype::u16:
      return "uint16";
    case dtype::i32:
      return "int32";
    case dtype::u32:
      return "uint32";
    case dtype::i64:
      return "int64";
    case dtype::u64:
      return "uint64";
    case dtype::f16:
      return "float16";
    case dtype::bf16:
      return "bfloat16";
    case dtype::f32:
      return "float32";
    case dtype::f64:
      return "float64";
    case dtype::f8_e4m3:
      return "float8_e4m3fn";
    case dtype::f8_e5m2:
      return "float8_e5m2";
  }
  return "";
}

/// The dtype of a torch dtype attribute name (also the aliases "float", "half", "long", ...).
CAIRN_INLINE std::optional<dtype> dtype_from_torch_name(std::string_view n) noexcept;

/// The dtype of a legacy storage class name ("FloatStorage" -> f32).
CAIRN_INLINE std::optional<dtype> dtype_from_storage_class(std::string_view n) noexcept;

/// The pickle value torch.save writes for a contiguous CPU tensor of `type` and `dims` whose
/// storage is record `data/<storage_key>` holding `storage_numel` elements, starting at element
/// `storage_offset`: `_rebuild_tensor_v2(persid, offset, size, stride, False, OrderedDict())`
/// (or `_rebuild_tensor_v3` with an UntypedStorage for dtypes without a legacy storage class).
CAIRN_INLINE pickle::value tensor_value(dtype type,
                                        const shape& dims,
                                        std::string storage_key,
                                        std::int64_t storage_numel,
                                        std::int64_t storage_offset = 0);

/// A tensor in memory to save: name, dtype, shape and its contiguous little-endian bytes.
struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::span<const std::byte> data;
};

/// Writes one `torch.save` archive at byte `base` of `out`: record `<prefix>/data.pkl` holding
/// `root` (pickle protocol 2), then the records torch 2.x writes (`.format_version`,
/// `.storage_alignment`, `byteorder`), the storages as `<prefix>/data/<i>` (i = index in
/// `storages`), and `version` = "3\n". Returns the archive size. Deterministic.
CAIRN_INLINE result<std::uint64_t> write_archive(
    object_writer& out,
    std::uint64_t base,
    std::string_view prefix,
    const pickle::value& root,
    std::span<const std::span<const std::byte>> storages,
    std::string file = {});

/// Writes `torch.save(t)` of one tensor at byte `base` of `out` (a DCP `.distcp` item); returns
/// its size. Prefix "archive", as torch writes to a stream.
CAIRN_INLINE result<std::uint64_t> write_tensor_item(object_writer& out,
                                                     std::uint64_t base,
                                                     const tensor_view& t,
                                                     std::string file = {});

/// Bytes handed over piece by piece: calls `append` with consecutive pieces, in order, until
/// every byte has been given (a tensor in device memory, read through a staging window).
using byte_stream =
    std::function<result<void>(const std::function<result<void>(std::span<const std::byte>)>&)>;

/// `write_tensor_item` of a tensor whose `nbytes` bytes come from `fill` piece by piece (`t.data`
/// unused), without holding them all at once.
CAIRN_INLINE result<std::uint64_t> write_tensor_item(object_writer& out,
                                                     std::uint64_t base,
                                                     const tensor_view& t,
                                                     std::uint64_t nbytes,
                                                     const byte_stream& fill,
                                                     std::string file = {});

/// Writes `torch.save({name: tensor, ...})` as object `name` on `st` (a `.pt` file). The
/// archive's folder is the file's basename without extension, as `torch.save(x, path)` does.
CAIRN_INLINE result<void> write_pt(storage_ref st,
                                   std::string_view name,
                                   const std::vector<tensor_view>& tensors);

/// A tensor found in a `torch.save` pickle: dtype, shape, strides and where its storage is.
struct tensor_ref {
  dtype type = dtype::f32;
  shape dims;
  shape strides;
  std::int64_t storage_offset = 0;  ///< in elements
  std::string storage_key;          ///< record `<prefix>/data/<storage_key>`
};

/// An opened `torch.save` archive: the zip, its folder prefix and the unpickled `data.pkl`.
struct archive {
  zip_archive zip;
  std::string prefix;  ///< "archive", or the saved file's basename
  pickle::value root;
};

/// Opens a `torch.save` archive in `object` at `[base, base + length)` (`length == 0`: to the
/// end), checking the common folder prefix and the version record, and unpickles `data.pkl`.
CAIRN_INLINE result<archive> open_archive(storage_ref st,
                                          std::string_view object,
                                          std::uint64_t base = 0,
                                          std::uint64_t length = 0);

namespace detail {
/// True when `dims` and `strides` (of one length) describe a view of `elem_size`-byte elements
/// whose sizes, strides, offset and extent all stay within `max_tensor_bytes` (torch has no
/// negative strides). Then `numel(dims)` and every index computation below cannot overflow.
CAIRN_INLINE bool valid_view(const shape& dims,
                             const shape& strides,
                             std::int64_t storage_offset,
                             std::size_t elem_size) noexcept;

/// The last element a non-empty view touches, or nullopt past `max_tensor_bytes`.
CAIRN_INLINE std::optional<std::uint64_t> view_last_element(const tensor_ref& t) noexcept;
}  // namespace detail

/// Decodes a tensor node (`_rebuild_tensor_v2`/`_v3`, or a `Parameter` around one) into a
/// `tensor_ref`; nullopt when `v` is not a tensor, or not a valid one (sizes, strides and offset
/// must be integers, non-negative and within `max_tensor_bytes`).
CAIRN_INLINE std::optional<tensor_ref> as_tensor(const pickle::value& v);

/// Bytes of all the paths `find_tensors` returns, at most (a file can share one tensor under
/// many deep paths; 256 MiB is far above any real state dict's keys).
inline constexpr std::uint64_t max_found_path_bytes = std::uint64_t{256} << 20;

/// Every tensor in `root`, keyed by its path: dict keys and list/tuple indices joined with '.'
/// (`{"model": {"w": t}}` -> "model.w"). A bare tensor is keyed "". Iterative; a value nested
/// deeper than `pickle::load_limits{}.max_depth` (impossible for one `load` returned with the
/// default limits) or whose paths exceed `max_found_path_bytes` throws `cairn::exception`
/// (`errc::resource`).
CAIRN_INLINE std::vector<std::pair<std::string, tensor_ref>> find_tensors(
    const pickle::value& root);

/// Largest view `read_tensor` materializes beyond the size of its storage: a view with
/// overlapping elements (stride 0, as `expand` makes) can claim far more elements than the file
/// holds.
inline constexpr std::uint64_t max_expanded_view_bytes = std::uint64_t{256} << 20;

/// Reads tensor `t` of archive `a` as contiguous row-major bytes (views with any strides and
/// storage offset are gathered), checking the view against its storage record before
/// allocating anything.
CAIRN_INLINE result<std::vector<std::byte>> read_tensor(const archive& a, const tensor_ref& t);

}  // namespace cairn::torch_zip

#if CAIRN_HEADER_ONLY
#  include "cairn/format/torch/zip-inl.hpp"
#endif
