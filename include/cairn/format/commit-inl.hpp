// cairn/format/commit-inl.hpp: the bodies of cairn/format/commit.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/format/commit.hpp"

namespace cairn {

CAIRN_INLINE result<void> put_checked(storage_ref st,
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
