// cairn/format/registry.hpp: the readers' half of the format registry, keyed by format id:
// which format a storage holds (`detect_format`) and its reader (`read_any_metadata` describes
// any format in cairn's terms). The writers' half, keyed by the same ids, is
// format/writers.hpp (`make_save_strategy("torch_dist")`), kept apart so that the load path
// does not include the save planner. The native format is built in; the foreign readers and
// writers (PyTorch DCP, safetensors) register themselves from cairn/format/foreign.hpp and
// cairn/strategies.hpp, so that the core headers do not pay for the pickle, ZIP and
// safetensors parsers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Read granularity for formats without checksum blocks: a partial read of a chunk reads whole
/// pieces of this size around the bytes it needs.
inline constexpr std::uint64_t foreign_read_block = std::uint64_t{256} << 10;

/// The files that tell the formats apart.
namespace format_files {
inline constexpr std::string_view dcp_metadata = ".metadata";  ///< PyTorch DCP
inline constexpr std::string_view safetensors_index = "model.safetensors.index.json";
inline constexpr std::string_view safetensors_one = "model.safetensors";
/// A safetensors file at the top of a storage (DCP's sharded safetensors have no index).
constexpr bool is_top_level_safetensors(std::string_view name) noexcept {
  return name.find('/') == std::string_view::npos && name.ends_with(".safetensors");
}
/// A `torch.save` file the torch_save format reads, at the top of a storage: `*.pt`, `*.pth`,
/// and Hugging Face's `pytorch_model.bin` / `pytorch_model-NNNNN-of-MMMMM.bin`.
constexpr bool is_torch_save_file(std::string_view name) noexcept {
  if (name.find('/') != std::string_view::npos) return false;
  if (name.ends_with(".pt") || name.ends_with(".pth")) return true;
  return name.starts_with("pytorch_model") && name.ends_with(".bin");
}
}  // namespace format_files

/// Reads a format other than the native one and describes it as cairn metadata.
using format_reader = result<checkpoint_metadata> (*)(storage_ref);

/// Reads a checkpoint's content metadata alone, without touching its data files.
using content_metadata_reader = result<std::map<std::string, std::string>> (*)(storage_ref);

/// A format other than the native one, as the readers know it: its id, how to recognize it in a
/// storage, the objects whose presence commits a checkpoint of it, and its reader. torch_dist
/// (PyTorch DCP) and safetensors are registered by cairn itself (their readers when
/// cairn/format/foreign.hpp is included); register your own with `register_format`.
struct format_driver {
  std::string id;  ///< "torch_dist", "safetensors", ...
  /// Detection asks the formats in this order (then by id); the native format always first.
  int detect_order = 100;
  /// Names (relative to the checkpoint) whose presence commits a checkpoint of this format:
  /// listings count a checkpoint as complete by them, deletions remove them first.
  std::vector<std::string> commit_markers;
  /// Whether `st` holds this format: cheap checks (existence, listing), no parsing.
  result<bool> (*detect)(storage_ref st) = nullptr;
  /// Its metadata in cairn's terms; null until a reader is registered (detection still names
  /// the format, and reading it says which header to include).
  format_reader read = nullptr;
  /// Its content metadata alone (`read_content_metadata`), where that is cheaper than `read`
  /// (torch_dist: Megatron's `common.pt`, not every item's ZIP directory); null: `read`'s.
  content_metadata_reader read_content = nullptr;
};

namespace detail {
CAIRN_INLINE std::map<std::string, format_driver, std::less<>>& format_drivers();
}  // namespace detail

/// Registers `driver` (replacing a driver of the same id; a null `read` keeps the reader the
/// old one had). Call it during static initialization or before any load; returns true.
CAIRN_INLINE bool register_format(format_driver driver);

/// Sets the reader of format `id` ("torch_dist", "safetensors") and, when given, its content
/// metadata reader, registering the format without detection if it is not known. Called during
/// static initialization by cairn/format/foreign.hpp; returns true.
CAIRN_INLINE bool register_format_reader(std::string id,
                                         format_reader reader,
                                         content_metadata_reader content = nullptr);

/// The registered formats other than the native one, in detection order.
CAIRN_INLINE std::vector<format_driver> registered_formats();

/// Whether `name` (relative to a checkpoint) commits a checkpoint of some format:
/// `metadata.json` (native) or a registered format's commit marker.
CAIRN_INLINE bool is_commit_marker(std::string_view name);

namespace detail {
/// What `detect_format` found, and for a native checkpoint read whole (`whole_native`), its
/// `metadata.json`, so that reading the metadata does not read the file a second time.
struct sniffed_format {
  std::string format;
  std::optional<std::string> native_json;
};

/// `detect_format`, reading a native `metadata.json` whole when `whole_native` (else its first
/// 4 KiB, which hold the `"format":"cairn"` member).
CAIRN_INLINE result<sniffed_format> sniff_format(storage_ref st, bool whole_native);
}  // namespace detail

namespace detail {
/// Why no format was detected on `st`: a `metadata.json` that is not cairn's is its read error;
/// otherwise `no_checkpoint_error` with every registered format's commit markers.
CAIRN_INLINE error no_format_error(storage_ref st);
}  // namespace detail

/// Which format is on `st`: "cairn" (`metadata.json` of the native format), else the first
/// registered format whose `detect` finds it: "torch_dist" (`.metadata`), "safetensors" (an
/// index, `model.safetensors`, or else `*.safetensors` files: DCP's sharded safetensors), a
/// format of your own; or "" when none.
CAIRN_INLINE result<std::string> detect_format(storage_ref st);

namespace detail {
/// The registered reader of foreign format `format`, or an error saying what to include.
CAIRN_INLINE result<format_reader> reader_of(storage_ref st, const std::string& format);
}  // namespace detail

/// Reads the metadata of whatever checkpoint format is on `st` (native, torch_dist, safetensors)
/// in cairn's terms. Fails with errc::incomplete_checkpoint when there is none, and with
/// errc::unsupported_version for a foreign format whose reader this program does not include.
CAIRN_INLINE result<checkpoint_metadata> read_any_metadata(storage_ref st);

/// `read_any_metadata` without the index files of a native checkpoint of format version 4 or
/// later: tensors' chunks stay in them (`m.index_refs`) for `read_index_sections` to read for
/// the keys a caller needs. Every other format reads as `read_any_metadata` reads it.
CAIRN_INLINE result<checkpoint_metadata> read_any_manifest(storage_ref st);

/// The user's content metadata of a checkpoint in any format, read without touching a data
/// file (Megatron's `load_content_metadata`): a native checkpoint's from `metadata.json`, a
/// torch_dist one's from the `content_metadata` dict of Megatron's `common.pt`, a safetensors
/// one's from the header's `__metadata__`.
CAIRN_INLINE result<std::map<std::string, std::string>> read_content_metadata(storage_ref st);

/// What `verify_any` checked, and what it found.
struct verify_report {
  std::string format;  ///< "cairn", "torch_dist" or "safetensors"
  /// Every byte was checked against a stored checksum (the native format). DCP and safetensors
  /// store none: their bytes were read and their layout checked, but a flipped bit in a value
  /// cannot be found.
  bool checksummed = false;
  std::vector<verify_problem> problems;  ///< empty when nothing is wrong
};

/// Verifies whatever checkpoint is on `st`. Native: `verify_checkpoint` (every checksum, file
/// sizes, chunks tiling each tensor). torch_dist (DCP) and safetensors, which carry no checksums:
/// their metadata is parsed and validated by its reader, every tensor's chunks must tile it
/// exactly, every chunk must lie inside its file, and every byte is read. Fails only when no
/// checkpoint or no readable metadata is there. `progress` is told the bytes checked ("verify").
CAIRN_INLINE result<verify_report> verify_any(storage_ref st,
                                              int threads = 2,
                                              const progress_callback& progress = {});

/// `read_any_metadata` as JSON, for sending to other ranks: a native `metadata.json` as it is
/// (not decoded here), or a foreign format's description (`foreign` set: it has no checksums).
struct metadata_json {
  std::string json;
  bool foreign = false;
};

namespace detail {
CAIRN_INLINE result<metadata_json> read_any_metadata_json_impl(storage_ref st);
}  // namespace detail

/// Reads `metadata_json` from `st` (see `read_any_metadata`).
CAIRN_INLINE result<metadata_json> read_any_metadata_json(storage_ref st);

namespace detail {

/// Converts a value read from a foreign format (Python's int, float and bool) to the dtype the
/// target asks for, when every element is exactly representable in it; nullopt otherwise.
CAIRN_INLINE std::optional<common_value> coerce_common(const common_value& from, dtype to);

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/format/registry-inl.hpp"
#endif
