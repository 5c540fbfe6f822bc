// cairn/convert/source-inl.hpp: the bodies of cairn/convert/source.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <string>

#include "cairn/convert/source.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"

namespace cairn::convert {

CAIRN_INLINE result<std::unique_ptr<source>> open_source(storage_ref st) {
  CAIRN_TRY_ASSIGN(std::string format, detect_format(st));
  if (format == "torch_dist") {
    CAIRN_TRY_ASSIGN(auto s, dcp::source::open(st));
    return std::unique_ptr<source>(std::move(s));
  }
  if (format.empty()) {
    error e = cairn::detail::no_format_error(st);
    if (e.code == errc::incomplete_checkpoint) {  // every registered format was looked for
      std::string looked = "cairn: " + std::string(metadata_name);
      for (const format_driver& d : registered_formats()) {
        looked += "; " + d.id + ":";
        for (std::size_t i = 0; i < d.commit_markers.size(); ++i)
          looked += (i ? " or " : " ") + d.commit_markers[i];
      }
      e.message =
          "not a readable checkpoint: no committed checkpoint of any format this "
          "program reads (" +
          looked + "); a save that never committed?";
    }
    return e;
  }
  CAIRN_TRY_ASSIGN(auto s, stream::catalog_source::open(st));
  return std::unique_ptr<source>(std::move(s));
}

}  // namespace cairn::convert
