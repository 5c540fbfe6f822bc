// cairn/comm/agree.hpp: the one cross-rank status protocol. Every collective step of save, load,
// async_saver and convert ends the same way: each rank reports how its local part went (and,
// optionally, a payload), and every rank learns every status, so that all ranks take the same
// branch and report the same error. Nothing here decides what a failure means: callers do.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/detail/message.hpp"

namespace cairn {

/// What every rank reported at one agreement point, indexed by rank.
struct rank_statuses {
  std::vector<std::optional<error>> status;  ///< each rank's failure, if any
  std::vector<bytes> payloads;               ///< each rank's payload (empty when none was sent)

  /// The failure of the lowest failing rank, tagged with that rank; nullopt when all succeeded.
  std::optional<error> first_failure() const;
};

namespace detail {

/// What a rank sends at an agreement point: its status (nullopt: success) and its payload.
struct status_message {
  static constexpr std::string_view message_name = "status";
  std::optional<error> status;
  bytes payload;
};

/// Adds `m`, received from rank `r`, to `out`; a malformed `m` becomes rank `r`'s failure.
inline void add_status(rank_statuses& out, std::span<const std::byte> m, int r) {
  result<status_message> got = decode_message<status_message>(m);
  if (!got) {
    out.status.emplace_back(std::move(got).err().with_rank(r));
    out.payloads.emplace_back();
    return;
  }
  out.status.push_back(std::move(got->status));
  out.payloads.push_back(std::move(got->payload));
}

}  // namespace detail

/// Collective: every rank sends its status `mine` (nullopt: success) and `payload`; returns what
/// every rank sent. Every rank gets the same answer, so every rank can take the same branch.
CAIRN_INLINE rank_statuses agree(comm_ref comm,
                                 const std::optional<error>& mine,
                                 std::span<const std::byte> payload = {});

/// Collective: rank `root` tells every rank an outcome, `mine` and `payload` there (the other
/// ranks' arguments are ignored). Returns root's status, tagged with its rank, and payload.
CAIRN_INLINE std::pair<std::optional<error>, bytes> announce(
    comm_ref comm,
    int root,
    const std::optional<error>& mine,
    std::span<const std::byte> payload = {});

/// Collective, with traffic that does not grow with the world on any rank but `root`: every
/// rank sends its status `mine` and `payload` to `root` (a gather); there, when every rank
/// succeeded, `decide(payloads)` (each rank's payload, by rank) returns the verdict: a failure
/// and a payload. Every rank receives the lowest failing rank's status, or the verdict. `decide`
/// runs only on `root` and must not call collectives; what it throws becomes the verdict.
template <class Decide>
std::pair<std::optional<error>, bytes> agree_at_root(comm_ref comm,
                                                     int root,
                                                     const std::optional<error>& mine,
                                                     std::span<const std::byte> payload,
                                                     Decide&& decide) {
  std::vector<bytes> all = comm.gather(
      detail::encode_message(detail::status_message{mine, {payload.begin(), payload.end()}}), root);
  std::optional<error> verdict;
  bytes out;
  if (comm.rank() == root) {
    rank_statuses got;
    for (std::size_t r = 0; r < all.size(); ++r)
      detail::add_status(got, all[r], static_cast<int>(r));
    all.clear();
    if (auto f = got.first_failure()) {
      verdict = std::move(f);
    } else {
      try {
        std::tie(verdict, out) = decide(got.payloads);
      } catch (...) {
        verdict = detail::current_exception_error("deciding at the root");
      }
    }
  }
  return announce(comm, root, verdict, out);
}

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/comm/agree-inl.hpp"
#endif
