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
  detail::binary_writer w;
  detail::put_error(w, mine);
  w.blob(payload);
  rank_statuses out;
  for (const auto& b : comm.all_gather(w.data())) {
    detail::binary_reader r(b);
    out.status.push_back(detail::get_error(r));
    out.payloads.push_back(r.blob());
  }
  return out;
}

CAIRN_INLINE std::pair<std::optional<error>, bytes> announce(comm_ref comm,
                                                             int root,
                                                             const std::optional<error>& mine,
                                                             std::span<const std::byte> payload) {
  bytes msg;
  if (comm.rank() == root) {
    detail::binary_writer w;
    detail::put_error(w, mine);
    w.blob(payload);
    msg = std::move(w.data());
  }
  comm.broadcast(msg, root);
  detail::binary_reader r(msg);
  std::optional<error> status = detail::get_error(r);
  if (status && status->rank < 0) status->rank = root;
  return {std::move(status), r.blob()};
}

}  // namespace cairn
