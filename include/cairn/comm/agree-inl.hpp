// cairn/comm/agree-inl.hpp: the bodies of cairn/comm/agree.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/comm/agree.hpp"

namespace cairn {

CAIRN_INLINE std::optional<error> rank_statuses::first_failure() const {
  for (std::size_t r = 0; r < status.size(); ++r)
    if (status[r]) return error(*status[r]).with_rank(static_cast<int>(r));
  return std::nullopt;
}

CAIRN_INLINE rank_statuses agree(comm_ref comm,
                                 const std::optional<error>& mine,
                                 std::span<const std::byte> payload) {
  const std::vector<bytes> all = comm.all_gather(
      detail::encode_message(detail::status_message{mine, {payload.begin(), payload.end()}}));
  rank_statuses out;
  for (std::size_t r = 0; r < all.size(); ++r) detail::add_status(out, all[r], static_cast<int>(r));
  return out;
}

CAIRN_INLINE std::pair<std::optional<error>, bytes> announce(comm_ref comm,
                                                             int root,
                                                             const std::optional<error>& mine,
                                                             std::span<const std::byte> payload) {
  bytes msg;
  if (comm.rank() == root)
    msg = detail::encode_message(detail::status_message{mine, {payload.begin(), payload.end()}});
  comm.broadcast(msg, root);
  result<detail::status_message> got = detail::decode_message<detail::status_message>(msg);
  if (!got) return {std::move(got).err().with_rank(root), bytes{}};
  std::optional<error> status = std::move(got->status);
  if (status && status->rank < 0) status->rank = root;
  return {std::move(status), std::move(got->payload)};
}

}  // namespace cairn
