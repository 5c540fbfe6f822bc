// cairn/format/dcp/writer.hpp: writing a PyTorch Distributed Checkpoint as Megatron's
// `torch_dist` backend does: data items (`torch.save` archives, written with
// `torch_zip::write_tensor_item`) recorded in DCP metadata, Megatron's `common.pt` and
// `metadata.json`, and `.metadata` written last as the commit. Used by the torch_dist save
// strategy and by `convert`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/commit.hpp"
#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/torch/pickle.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {
/// Name of Megatron's common-state file in a torch_dist checkpoint.
inline constexpr std::string_view megatron_common_name = "common.pt";
}  // namespace cairn

namespace cairn::dcp {

/// Megatron's `metadata.json` for a torch_dist checkpoint (all four keys: every Megatron
/// version reads it).
inline constexpr std::string_view megatron_metadata_json =
    "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
    "\"common_backend\": \"torch\", \"common_backend_version\": 1}";

/// Whether torch of flavor `f` has dtype `t`: torch 1.13 lacks the unsigned types beyond uint8
/// (added in torch 2.3) and the float8 types (2.1); `flavor::torch2` writes them all.
constexpr bool flavor_holds(flavor f, dtype t) noexcept {
  if (f != flavor::torch1_13) return true;
  switch (t) {
    case dtype::u16:
    case dtype::u32:
    case dtype::u64:
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:
      return false;
    default:
      return true;
  }
}

/// errc::invalid_argument naming `key` when torch of flavor `f` has no dtype `t`.
CAIRN_INLINE result<void> check_flavor_holds(flavor f, dtype t, const std::string& key);

/// Records chunk `region` of tensor `key` (`type`, `global_shape`), stored at `where`, in `m`.
CAIRN_INLINE void add_tensor_chunk(metadata& m,
                                   const std::string& key,
                                   dtype type,
                                   const shape& global_shape,
                                   const box& region,
                                   storage_info where);

/// Records the bytes item `key` (a sharded object), stored at `where`, in `m`.
CAIRN_INLINE void add_bytes_item(metadata& m, const std::string& key, storage_info where);

/// The Python value of a common value (ints, floats, bools, lists of them, strings), as
/// Megatron's `common.pt` holds it.
CAIRN_INLINE pickle::value common_to_pickle(const common_value& c);

namespace detail {
/// An object_writer into memory, for a small file then written whole with `put`.
class buffer_writer final : public object_writer {
 public:
  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override;
  result<void> finish() override { return ok(); }
  /// Everything written.
  const bytes& data() const noexcept { return buf_; }

 private:
  std::mutex mu_;
  bytes buf_;
};
}  // namespace detail

/// Key of the content metadata in Megatron's common state (`_CONTENT_METADATA_KEY`): what
/// `save(..., content_metadata=...)` stores and `load_content_metadata` returns.
inline constexpr std::string_view megatron_content_metadata_key = "content_metadata";

/// The user's content metadata as Megatron keeps it: a dict of str to str under
/// `megatron_content_metadata_key` in `common.pt`.
CAIRN_INLINE pickle::value content_metadata_to_pickle(
    const std::map<std::string, std::string>& content_metadata);

/// Writes Megatron's `common.pt` (`torch.save` of {path: Python value}, plus
/// `content_metadata` when `content_metadata` is not empty) with one `put`. `Commons` is any
/// range of (path, common_value) pairs.
template <class Commons>
result<void> put_common_pt(storage_ref st,
                           const Commons& commons,
                           const std::map<std::string, std::string>& content_metadata = {}) {
  std::vector<std::pair<pickle::value, pickle::value>> entries;
  for (const auto& [path, c] : commons) {
    if (path == megatron_content_metadata_key && !content_metadata.empty())
      return make_error(errc::invalid_argument,
                        "a common value named \"content_metadata\" and content_metadata in one "
                        "torch_dist checkpoint: Megatron keeps the content metadata under that key")
          .with_key(std::string(path));
    entries.emplace_back(pickle::value::string(path), common_to_pickle(c));
  }
  if (!content_metadata.empty())
    entries.emplace_back(pickle::value::string(std::string(megatron_content_metadata_key)),
                         content_metadata_to_pickle(content_metadata));
  detail::buffer_writer buf;
  CAIRN_TRY(torch_zip::write_archive(buf, 0, "common", pickle::value::dict(std::move(entries)), {},
                                     st.describe(megatron_common_name)));
  if (auto p = st.put(megatron_common_name, buf.data()); !p)
    return std::move(p).err().with_file(st.describe(megatron_common_name));
  return ok();
}

/// Writes the small files of a torch_dist checkpoint whose data files are written: Megatron's
/// `common.pt` (when `commons` or `content_metadata` holds any) and `metadata.json`, then
/// `.metadata` last, re-reading its size (the commit). Returns the names written, in order.
template <class Commons>
result<std::vector<std::string>> write_commit_files(
    storage_ref st,
    const metadata& m,
    flavor f,
    const Commons& commons,
    const std::map<std::string, std::string>& content_metadata = {}) {
  std::vector<std::string> written;
  if (!std::empty(commons) || !content_metadata.empty()) {
    CAIRN_TRY(put_common_pt(st, commons, content_metadata));
    written.emplace_back(megatron_common_name);
  }
  if (auto p = st.put(cairn::metadata_name, std::as_bytes(std::span(megatron_metadata_json))); !p)
    return std::move(p).err().with_file(st.describe(cairn::metadata_name));
  written.emplace_back(cairn::metadata_name);
  CAIRN_TRY_ASSIGN(std::string encoded, encode(m, f));
  CAIRN_TRY(cairn::put_checked(st, metadata_name, std::as_bytes(std::span(encoded))));
  written.emplace_back(metadata_name);
  return written;
}

/// Removes from the torch_dist checkpoint on `st` every item (tensor or bytes item) whose fqn
/// `drop` selects, as Megatron's `TorchDistSaveShardedStrategy.remove_sharded_tensors` does:
/// `.metadata` is written again without their `state_dict_metadata`, `planner_data` and
/// `storage_data` entries in one atomic `put` (in the flavor it was read in), then the `.distcp`
/// files no item references any more are removed. Returns the removed fqns, sorted; when none
/// matches, nothing is written. A `.metadata` with Megatron's `mcore_data` (N-D flattened
/// tensors) is refused with errc::unsupported_version: a rewrite would lose it.
CAIRN_INLINE result<std::vector<std::string>> remove_items(
    storage_ref st, const std::function<bool(std::string_view fqn)>& drop);

}  // namespace cairn::dcp

#if CAIRN_HEADER_ONLY
#  include "cairn/format/dcp/writer-inl.hpp"
#endif
