// cairn/format/commit.hpp: writing the object that commits a checkpoint, for every format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cairn/core/error.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

/// Puts a commit object and checks that storage holds all of it afterwards (one `size` call): a
/// backend that reports success for a short write (a lying disk) gets one more `put`; if the
/// object is still wrong, the commit fails (and `save_strategy::committed` decides what that
/// means).
inline result<void> put_checked(storage_ref st,
                                std::string_view name,
                                std::span<const std::byte> data) {
  for (int attempt = 0;; ++attempt) {
    if (auto p = st.put(name, data); !p) return std::move(p).err().with_file(st.describe(name));
    CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(name));
    if (n == data.size()) return ok();
    if (attempt > 0)
      return make_error(errc::io, "storage reported the write of " + std::to_string(data.size()) +
                                      " bytes as done, but holds " + std::to_string(n))
          .with_file(st.describe(name));
  }
}

}  // namespace cairn
