// cairn/format/stream/writers.hpp: the streaming writers by name, what `convert`, `unshard` and
// `cairn convert --format` write. Each format's folder registers its own
// (format/<format>/stream_writer.hpp; a format of your own registers from its folder), so that
// convert chooses a writer by name and knows nothing of any format.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/source.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::stream {

/// What a streaming writer is told beyond the source and the destination.
struct write_job {
  stream_settings settings;
  /// Descriptive strings the output keeps where its format has a place for them (safetensors:
  /// every file's `__metadata__`).
  std::map<std::string, std::string> metadata;
  /// The writer's own settings, by the names it declares (`stream_writer::settings`), as text:
  /// "chunk_size" (safetensors chunks), "flavor" (torch_dist: torch2 or torch1_13).
  std::map<std::string, std::string, std::less<>> options;
  /// The source's sharded objects (read once by `convert`), when the writer holds objects.
  std::map<std::string, object_entry> objects;
};

/// Writes `src` into `dst` (empty, or holding a checkpoint being written over): every tensor one
/// slab at a time, the objects when it holds them, the commons when it holds them, its commit
/// object last. Refuses what its format cannot hold (errc::invalid_argument naming the key)
/// before writing anything. `progress` (when not null) is told the source bytes done.
using stream_write_fn = result<void> (*)(source& src,
                                         storage_ref dst,
                                         const write_job& job,
                                         stream_stats& stats,
                                         cairn::detail::progress_meter* progress);

/// A streaming writer: one output layout of one format.
struct stream_writer {
  /// Its name, what `cairn convert --format` takes ("native", "torch_dist", "one_file", ...).
  std::string name;
  /// Other names for it ("cairn"; "dcp", "torch"; "safetensors").
  std::vector<std::string> aliases;
  /// What `detect_format` calls its output ("cairn", "torch_dist", "safetensors", ...).
  std::string format;
  /// Its output holds the source's sharded objects (`write_job::objects` is filled).
  bool holds_objects = false;
  /// Its output holds the source's common values (the writer reads `source::commons`).
  bool holds_commons = false;
  /// Every tensor is whole in one place of its output (what `unshard` writes).
  bool whole_tensors = false;
  /// The names of the settings it reads from `write_job::options`.
  std::vector<std::string> settings;
  stream_write_fn write = nullptr;
};

namespace detail {
CAIRN_INLINE std::map<std::string, stream_writer, std::less<>>& stream_writers();
}  // namespace detail

/// Registers `w` under its name, replacing a writer of that name. Called during static
/// initialization by the header that defines it; returns true. A name or alias that another
/// writer already has is an error (errc::already_exists), and nothing is registered.
CAIRN_INLINE result<bool> register_stream_writer(stream_writer w);

/// The writer called `name` (its name or an alias), or errc::not_found listing every name.
CAIRN_INLINE result<const stream_writer*> find_stream_writer(std::string_view name);

/// The names of every registered writer, sorted (aliases not included).
CAIRN_INLINE std::vector<std::string> stream_writer_names();

namespace detail {
/// The unsigned number `text` of setting `name`, or errc::invalid_argument naming it.
CAIRN_INLINE result<std::uint64_t> parse_count(std::string_view name, std::string_view text);
}  // namespace detail

}  // namespace cairn::stream

#if CAIRN_HEADER_ONLY
#  include "cairn/format/stream/writers-inl.hpp"
#endif
