// cairn/format/safetensors/file.hpp: the safetensors file format (huggingface/safetensors) — a
// streaming, deterministic writer, a validating reader with byte-range reads, and the Hugging
// Face `model.safetensors.index.json`. Layout notes in docs/safetensors.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::safetensors {

/// Largest header the reference reader accepts (`MAX_HEADER_SIZE`).
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// Largest index (`model.safetensors.index.json`) read: as large as a header may be, since an
/// index names each tensor once as a header does.
inline constexpr std::uint64_t max_index_size = max_header_size;

/// A tensor to be written: name, dtype and shape (row-major, little-endian data).
struct tensor_decl {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
};

/// One tensor of a file: `begin`/`end` are byte offsets relative to the data buffer (the
/// reference's `data_offsets`); `file_offset()` is where its bytes start in the file.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t data_start = 0;  ///< 8 + header length: start of the data buffer in the file
  /// Number of bytes of the tensor.
  std::uint64_t nbytes() const noexcept { return end - begin; }
  /// Absolute byte offset of the tensor's first byte in the file.
  std::uint64_t file_offset() const noexcept { return data_start + begin; }
};

/// A parsed (or planned) header: `__metadata__`, the tensors in data order, and sizes.
struct header {
  std::map<std::string, std::string> metadata;  ///< the `__metadata__` string map
  std::vector<tensor_info> tensors;             ///< ordered by `begin`
  std::uint64_t data_start = 0;                 ///< 8 + header length
  std::uint64_t file_size = 0;                  ///< data_start + total data bytes
  /// The tensor named `name`, or nullptr.
  const tensor_info* find(std::string_view name) const noexcept;
};

namespace detail {
/// The reference writer's order key: the Rust `Dtype` enum is declared by increasing alignment
/// and files are sorted by descending dtype, then name.
constexpr int dtype_rank(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
      return 0;
    case dtype::u8:
      return 4;
    case dtype::i8:
      return 5;
    case dtype::f8_e5m2:
      return 6;
    case dtype::f8_e4m3:
      return 7;
    case dtype::i16:
      return 10;
    case dtype::u16:
      return 11;
    case dtype::f16:
      return 12;
    case dtype::bf16:
      return 13;
    case dtype::i32:
      return 14;
    case dtype::u32:
      return 15;
    case dtype::f32:
      return 16;
    case dtype::f64:
      return 18;
    case dtype::i64:
      return 19;
    case dtype::u64:
      return 20;
  }
  return 0;
}

/// Bytes of a tensor of `dims` and `t`; `ok` false for a negative extent or more than
/// `max_tensor_bytes` (see `format_detail::file_numel`).
CAIRN_INLINE std::uint64_t checked_nbytes(const shape& dims, dtype t, bool& ok);
}  // namespace detail

/// Lays out a file: sorts tensors as the reference writer does (`__metadata__` first, then by
/// descending dtype alignment and name), assigns `data_offsets`, and returns the header with
/// `data_start`/`file_size`. Errors on duplicate or empty names and negative dimensions.
CAIRN_INLINE result<header> plan(std::vector<tensor_decl> tensors,
                                 std::map<std::string, std::string> metadata = {});

/// The header bytes of a planned file: the 8-byte little-endian length and the JSON, padded
/// with spaces to a multiple of 8 bytes. Also sets `h.data_start` and `h.file_size`.
CAIRN_INLINE std::string encode_header(header& h);

/// Streams one safetensors file into an `object_writer`: the header is written at `open`, then
/// each tensor's bytes by `write` (whole tensor) or `write_at` (a byte range of a tensor, in any
/// order, disjoint ranges). Memory is bounded by what the caller passes. `finish` checks every
/// tensor was fully written and finishes the object. The same declarations and bytes always
/// give a byte-identical file.
class writer {
 public:
  /// Opens `name` on `st` and lays out `tensors`. The header is written by `finish()`, after
  /// every tensor byte: a writer killed before that leaves a file whose first 8 bytes are zero
  /// (an invalid header length), never a valid header over data with holes in it.
  static result<writer> open(storage_ref st,
                             std::string_view name,
                             std::vector<tensor_decl> tensors,
                             std::map<std::string, std::string> metadata = {});

  /// The planned header (tensor order and offsets).
  const header& planned() const noexcept { return h_; }

  /// Writes all bytes of tensor `name` (size must equal dtype size × numel).
  result<void> write(std::string_view name, std::span<const std::byte> data);

  /// Writes `data` at byte `offset` inside tensor `name`. Thread-safe for disjoint ranges.
  result<void> write_at(std::string_view name,
                        std::uint64_t offset,
                        std::span<const std::byte> data);

  /// Checks that every tensor received exactly its bytes, writes the header, then finishes the
  /// object.
  result<void> finish();

 private:
  writer(header h, std::unique_ptr<object_writer> out, std::string file);
  result<std::size_t> index(std::string_view name) const;
  header h_;
  std::string header_bytes_;  // written last, by finish()
  std::unique_ptr<object_writer> out_;
  std::string file_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<std::uint64_t> written_;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();  // guards written_
};

/// A tensor and its bytes, for `write_file`.
struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  shape dims;
  std::span<const std::byte> data;
};

/// Writes a whole safetensors file from tensors already in memory.
CAIRN_INLINE result<void> write_file(storage_ref st,
                                     std::string_view name,
                                     const std::vector<tensor_view>& tensors,
                                     std::map<std::string, std::string> metadata = {});

namespace detail {

/// Parses the entries of header `json` into `h` in document order (`__metadata__` and tensors),
/// rejecting a duplicate key. `cur_key` is the entry being read, for errors simdjson throws.
CAIRN_INLINE result<void> parse_header_entries(std::string_view json,
                                               std::string_view file,
                                               header& h,
                                               std::string& cur_key);

/// Sorts `h.tensors` by offsets and checks that they tile the data buffer from 0 without gaps
/// or overlaps and end exactly at the end of the file.
CAIRN_INLINE result<void> check_data_layout(header& h, std::string_view file);

}  // namespace detail

/// Parses and validates a header (the JSON after the 8-byte length) of a file of `file_size`
/// bytes, applying every rule of the reference reader: `__metadata__` is a string map, entries
/// have a known dtype, non-negative shape and `data_offsets` whose size matches dtype × shape,
/// tile the buffer from 0 without gaps or overlaps, and end exactly at the end of the file; no
/// duplicate keys. Errors are `errc::corrupt` naming `file`, the key and a byte offset.
CAIRN_INLINE result<header> parse_header(std::string_view json,
                                         std::uint64_t file_size,
                                         std::string_view file);

/// Reads and validates the header of safetensors object `name` on `st`.
CAIRN_INLINE result<header> read_header(storage_ref st, std::string_view name);

/// Reads `out.size()` bytes starting at byte `offset` of tensor `key` (a partial load).
CAIRN_INLINE result<void> read_range(storage_ref st,
                                     std::string_view name,
                                     const header& h,
                                     std::string_view key,
                                     std::uint64_t offset,
                                     std::span<std::byte> out);

/// Reads all bytes of tensor `key` into `out` (which must be exactly its size).
CAIRN_INLINE result<void> read_tensor(storage_ref st,
                                      std::string_view name,
                                      const header& h,
                                      std::string_view key,
                                      std::span<std::byte> out);

/// The `__metadata__` key under which PyTorch DCP's safetensors files (`HuggingFaceStorageWriter`
/// with `save_distributed=True`, torch >= 2.8) say where each of their tensors sits in its whole
/// tensor: a JSON string `{name: {"saved_offsets": [...]}}`.
inline constexpr std::string_view dcp_sharding_info_key = "DCP_SHARDING_INFO";

/// Parses a `DCP_SHARDING_INFO` value: tensor name -> offset of the file's piece in the whole
/// tensor. `file` names it in errors; offsets must be non-negative integers.
CAIRN_INLINE result<std::map<std::string, shape>> sharding_offsets_from_json(std::string_view json,
                                                                             std::string_view file);

/// Hugging Face's sharded-checkpoint index (`model.safetensors.index.json`).
struct index {
  std::uint64_t total_size = 0;                   ///< `metadata.total_size`: bytes of all tensors
  std::map<std::string, std::string> weight_map;  ///< tensor name -> file name
  std::map<std::string, std::string> extra_metadata;  ///< other string-valued `metadata` fields
};

/// Conventional file name of the index.
inline constexpr std::string_view index_name = "model.safetensors.index.json";

/// The index as JSON, formatted as transformers writes it (`indent=2, sort_keys=True`, newline).
CAIRN_INLINE std::string to_json(const index& ix);

/// Parses an index; `file` names it in errors. Unknown top-level fields are ignored.
CAIRN_INLINE result<index> index_from_json(std::string_view json, std::string_view file);

/// Writes the index as object `name` (atomically, with `put`).
CAIRN_INLINE result<void> write_index(storage_ref st, std::string_view name, const index& ix);

/// Reads the index object `name` (`errc::resource` past `max_index_size`).
CAIRN_INLINE result<index> read_index(storage_ref st, std::string_view name);

}  // namespace cairn::safetensors

#if CAIRN_HEADER_ONLY
#  include "cairn/format/safetensors/file-inl.hpp"
#endif
