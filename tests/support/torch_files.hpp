// tests/support/torch_files.hpp: `torch.save` files written in a test, as torch would write them,
// for the readers of torch.save state dicts and of DeepSpeed checkpoints.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/memory.hpp"

namespace cairn_test {

/// Writes `torch.save(root)` as object `name` of `st` (`folder/file.pt` too), with `storages` as
/// its data records 0, 1, ...; the archive's folder is the file's basename without extension.
inline void put_pt(cairn::memory_storage& st,
                   const std::string& name,
                   const cairn::pickle::value& root,
                   const std::vector<std::span<const std::byte>>& storages) {
  auto w = st.open_writer(name).value();
  const std::string base = name.substr(name.rfind('/') + 1);
  cairn::torch_zip::write_archive(*w, 0, base.substr(0, base.rfind('.')), root, storages, name)
      .value();
  w->finish().value();
}

}  // namespace cairn_test
