// cairn/storage/storage-inl.hpp: the bodies of cairn/storage/storage.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/storage/storage.hpp"

namespace cairn::detail {

CAIRN_INLINE error truncated_read(const std::string& file,
                                  std::uint64_t offset,
                                  std::uint64_t got,
                                  std::uint64_t object_size) {
  error e = make_error(errc::corrupt,
                       "truncated: reading bytes at offset " + std::to_string(offset) + " of " +
                           file + ", the object ends at byte " + std::to_string(object_size));
  e.file = file;
  e.offset = offset + got;
  return e;
}

}  // namespace cairn::detail
