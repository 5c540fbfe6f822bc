// cairn/storage/open.hpp: open_storage(uri), the storage a path or URI names, through a registry
// of URI schemes. Built in: plain paths and file:// (file_storage), memory:// (a named
// memory_storage shared by the whole process). cairn/storage/s3.hpp registers s3:// when it is
// included, so this header never needs libcurl; a program may register schemes of its own.
#pragma once

#include <cctype>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/memory.hpp"

namespace cairn {

/// Opens the storage of a URI of one scheme; it receives the whole URI ("s3://bucket/prefix").
using storage_opener = std::function<result<any_storage>(std::string_view uri)>;

namespace detail {

struct storage_scheme_registry {
  std::mutex mu;
  std::map<std::string, storage_opener, std::less<>> openers;
  std::map<std::string, std::shared_ptr<memory_storage>, std::less<>> memories;
};

/// The process-wide registry (one per program: an inline function's static).
CAIRN_INLINE storage_scheme_registry& storage_schemes_state();

/// The scheme of "scheme://rest", lower-cased, or empty when `uri` does not start with one (a
/// scheme is a letter followed by letters, digits, '+', '-' or '.').
CAIRN_INLINE std::string uri_scheme(std::string_view uri);

CAIRN_INLINE result<any_storage> open_file_uri(std::string_view uri);

}  // namespace detail

/// Makes `open` the opener of URIs "`scheme`://..." (case-insensitive), replacing an earlier one
/// of that scheme (the built-in `file` and `memory` included). Thread-safe.
///
/// ```
/// cairn::register_storage_scheme("kv", [](std::string_view uri) ->
/// cairn::result<cairn::any_storage> {
///   return cairn::any_storage(kv_storage(uri));
/// });
/// ```
CAIRN_INLINE void register_storage_scheme(std::string_view scheme, storage_opener open);

/// The process-wide memory_storage that `memory://name` opens: created empty on first use and
/// kept until the process ends, so every `open_storage("memory://name")` sees the same objects.
CAIRN_INLINE std::shared_ptr<memory_storage> named_memory_storage(std::string_view name);

/// The schemes `open_storage` knows now, sorted ("file", "memory", and "s3" once
/// cairn/storage/s3.hpp is part of the program).
CAIRN_INLINE std::vector<std::string> storage_schemes();

/// The storage that `uri` names, owned by the returned handle:
/// - a plain path ("ckpt/step_100", "/data/ckpt") or `file://path` (`file:///data/ckpt`):
///   a `file_storage` rooted there (created on the first write);
/// - `memory://name`: the process-wide `named_memory_storage(name)`;
/// - `s3://bucket/prefix`: an `s3_storage` with endpoint and credentials from the environment
///   (`AWS_*`), when cairn/storage/s3.hpp is part of the program (target cairn::s3);
/// - any scheme given to `register_storage_scheme`.
///
/// An unknown scheme is errc::invalid_argument naming the URI and the known schemes; a URI its
/// opener refuses is that opener's error (errc::invalid_argument naming it for the built-in
/// ones and s3://). Keep the handle alive while anything references the storage.
CAIRN_INLINE result<any_storage> open_storage(std::string_view uri);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/open-inl.hpp"
#endif
