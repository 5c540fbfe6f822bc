// cairn/comm/threads-inl.hpp: the bodies of cairn/comm/threads.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <iterator>
#include <memory>
#include <thread>

#include "cairn/comm/threads.hpp"
#include "cairn/core/error.hpp"

namespace cairn::detail {

CAIRN_INLINE std::string what_of(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE thread_group::thread_group(int size, std::chrono::milliseconds deadline)
    : size_(size),
      deadline_(deadline),
      slots_(size > 0 ? static_cast<std::size_t>(size) : 0),
      messages_(slots_.size(), nullptr),
      saw_abort_(slots_.size(), 0),
      arrived_here_(slots_.size(), 0) {
  if (size < 1) {
    throw exception(
        make_error(errc::invalid_argument,
                   "thread_group needs at least one rank, got " + std::to_string(size)));
  }
  if (deadline.count() < 0)
    throw exception(
        make_error(errc::invalid_argument,
                   "a negative collective deadline: " + std::to_string(deadline.count()) + " ms"));
}

CAIRN_INLINE void thread_group::abort(int rank, std::string_view what) {
  std::lock_guard lk(mu_);
  abort_locked(rank < 0 ? "thread group aborted: " + std::string(what)
                        : "rank " + std::to_string(rank) + " failed: " + std::string(what));
}

CAIRN_INLINE void thread_group::finish(int rank) {
  check_rank(rank);
  std::lock_guard lk(mu_);
  if (finished_rank_ < 0) finished_rank_ = rank;
  if (arrived_ > 0) {
    abort_locked("rank " + std::to_string(rank) + " returned while rank " +
                 std::to_string(first_rank_) + " waits in " + describe(first_op_) +
                 " (collective #" + std::to_string(collectives_) + ")");
  }
}

CAIRN_INLINE bool thread_group::aborted() const {
  std::lock_guard lk(mu_);
  return aborted_;
}

CAIRN_INLINE std::string thread_group::abort_message() const {
  std::lock_guard lk(mu_);
  return abort_message_;
}

CAIRN_INLINE bool thread_group::saw_abort(int rank) const {
  check_rank(rank);
  std::lock_guard lk(mu_);
  return saw_abort_[static_cast<std::size_t>(rank)] != 0;
}

CAIRN_INLINE std::string thread_group::describe(op o) {
  switch (o.kind) {
    case op_kind::barrier:
      return "barrier";
    case op_kind::all_gather:
      return "all_gather";
    case op_kind::broadcast:
      return "broadcast(root " + std::to_string(o.root) + ")";
    case op_kind::gather:
      return "gather(root " + std::to_string(o.root) + ")";
    case op_kind::all_to_all:
      return "all_to_all";
  }
  return "?";
}

CAIRN_INLINE void thread_group::check_rank(int rank) const {
  if (rank < 0 || rank >= size_) {
    throw exception(
        make_error(errc::invalid_argument, "rank " + std::to_string(rank) +
                                               " is out of range for a thread group of size " +
                                               std::to_string(size_)));
  }
}

CAIRN_INLINE void thread_group::abort_locked(std::string message) {
  if (aborted_) return;
  aborted_ = true;
  abort_message_ = std::move(message);
  cv_.notify_all();
  // Lock order: a group, then its duplicates (a duplicate never locks the group it copies).
  for (auto& d : duplicates_)
    if (auto g = d.lock()) g->abort(-1, "the group it duplicates was aborted: " + abort_message_);
}

CAIRN_INLINE std::shared_ptr<thread_group> thread_group::next_duplicate(int rank) {
  check_rank(rank);
  std::lock_guard lk(mu_);
  if (duplicates_taken_.empty()) duplicates_taken_.assign(static_cast<std::size_t>(size_), 0);
  const std::size_t k = duplicates_taken_[static_cast<std::size_t>(rank)]++;
  auto it = std::find_if(open_duplicates_.begin(), open_duplicates_.end(),
                         [&](const auto& o) { return o.first == k; });
  if (it == open_duplicates_.end()) {
    auto g = std::make_shared<thread_group>(size_, deadline_);
    if (aborted_) g->abort(-1, "the group it duplicates was aborted: " + abort_message_);
    std::erase_if(duplicates_, [](const std::weak_ptr<thread_group>& d) { return d.expired(); });
    duplicates_.push_back(g);
    open_duplicates_.push_back({k, open_duplicate{std::move(g), 0}});
    it = std::prev(open_duplicates_.end());
  }
  std::shared_ptr<thread_group> g = it->second.group;
  if (++it->second.taken == size_) open_duplicates_.erase(it);  // the handles own it now
  return g;
}

CAIRN_INLINE void thread_group::throw_aborted_locked(int rank) {
  saw_abort_[static_cast<std::size_t>(rank)] = 1;
  throw exception(make_error(errc::comm, abort_message_).with_rank(rank));
}

CAIRN_INLINE void thread_group::enter(int rank,
                                      op o,
                                      std::span<const std::byte> payload,
                                      const std::vector<bytes>* messages) {
  std::unique_lock lk(mu_);
  if (aborted_) throw_aborted_locked(rank);
  if (finished_rank_ >= 0) {
    abort_locked("rank " + std::to_string(rank) + " called " + describe(o) + " after rank " +
                 std::to_string(finished_rank_) + " returned (collective #" +
                 std::to_string(collectives_) + ")");
    throw_aborted_locked(rank);
  }
  if (arrived_ == 0) {
    first_op_ = o;
    first_rank_ = rank;
  } else if (!(o == first_op_)) {
    abort_locked("collective mismatch at collective #" + std::to_string(collectives_) + ": rank " +
                 std::to_string(first_rank_) + " called " + describe(first_op_) + ", rank " +
                 std::to_string(rank) + " called " + describe(o));
    throw_aborted_locked(rank);
  }
  slots_[static_cast<std::size_t>(rank)] = payload;
  messages_[static_cast<std::size_t>(rank)] = messages;
  arrived_here_[static_cast<std::size_t>(rank)] = 1;
  const std::uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    std::fill(arrived_here_.begin(), arrived_here_.end(), 0);
    ++generation_;
    ++collectives_;
    cv_.notify_all();
    return;
  }
  auto done = [&] { return generation_ != gen || aborted_; };
  if (deadline_.count() == 0) {
    cv_.wait(lk, done);
  } else if (!cv_.wait_for(lk, deadline_, done)) {
    std::string missing;
    for (int r = 0; r < size_; ++r)
      if (!arrived_here_[static_cast<std::size_t>(r)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    abort_locked("rank(s) " + missing + " did not arrive at " + describe(o) + " (collective #" +
                 std::to_string(collectives_) + ") within " + std::to_string(deadline_.count()) +
                 " ms; rank " + std::to_string(rank) + " waited");
  }
  if (generation_ == gen) throw_aborted_locked(rank);
}

CAIRN_INLINE void thread_group::leave() {
  std::unique_lock lk(mu_);
  const std::uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen; });
}

CAIRN_INLINE void thread_group::finish_collective(int rank, std::exception_ptr copy_error) {
  if (!copy_error) return;
  abort(rank, detail::what_of(copy_error));
  std::rethrow_exception(copy_error);
}

CAIRN_INLINE std::vector<bytes> thread_communicator::all_gather(std::span<const std::byte> data) {
  return collect({thread_group::op_kind::all_gather, -1}, data, nullptr, true,
                 [&](int r) { return group_->slot(r); });
}

CAIRN_INLINE void thread_communicator::broadcast(bytes& buf, int root) {
  check_root(root, "broadcast");
  group_->enter(rank_, {thread_group::op_kind::broadcast, root},
                rank_ == root ? std::span<const std::byte>(buf) : std::span<const std::byte>());
  std::exception_ptr copy_error;
  if (rank_ != root) {
    try {
      auto s = group_->slot(root);
      buf.assign(s.begin(), s.end());
    } catch (...) {
      copy_error = std::current_exception();
    }
  }
  group_->leave();
  group_->finish_collective(rank_, copy_error);
}

CAIRN_INLINE std::vector<bytes> thread_communicator::gather(std::span<const std::byte> data,
                                                            int root) {
  check_root(root, "gather");
  return collect({thread_group::op_kind::gather, root}, data, nullptr, rank_ == root,
                 [&](int r) { return group_->slot(r); });
}

CAIRN_INLINE std::vector<bytes> thread_communicator::all_to_all(const std::vector<bytes>& to) {
  if (to.size() != static_cast<std::size_t>(size())) {
    std::string what = "all_to_all needs one buffer per rank (" + std::to_string(size()) +
                       "), got " + std::to_string(to.size());
    group_->abort(rank_, what);
    throw exception(make_error(errc::invalid_argument, std::move(what)).with_rank(rank_));
  }
  return collect({thread_group::op_kind::all_to_all, -1}, {}, &to, true,
                 [&](int r) { return group_->message(r, rank_); });
}

CAIRN_INLINE void thread_communicator::check_root(int root, const char* collective) {
  if (root >= 0 && root < size()) return;
  std::string what = std::string(collective) + " root " + std::to_string(root) +
                     " is out of range for a thread group of size " + std::to_string(size());
  group_->abort(rank_, what);
  throw exception(make_error(errc::invalid_argument, std::move(what)).with_rank(rank_));
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE void run_ranks_erased(int n,
                                   std::chrono::milliseconds deadline,
                                   void (*call)(void*, thread_communicator&),
                                   void* ctx) {
  thread_group group(n, deadline);
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::exception_ptr> errors(un);
  std::vector<char> is_cause(un, 0);
  std::vector<std::thread> threads;
  threads.reserve(un);

  auto body = [&](int rank) {
    const auto ur = static_cast<std::size_t>(rank);
    try {
      thread_communicator comm(group, rank);
      call(ctx, comm);
      group.finish(rank);
    } catch (...) {
      errors[ur] = std::current_exception();
      is_cause[ur] = group.saw_abort(rank) ? 0 : 1;
      group.abort(rank, detail::what_of(errors[ur]));
    }
  };

  std::exception_ptr start_error;
  for (int r = 0; r < n; ++r) {
    try {
      threads.emplace_back(body, r);
    } catch (...) {
      start_error = std::current_exception();
      group.abort(r, "could not start its thread: " + detail::what_of(start_error));
      break;
    }
  }
  for (auto& t : threads) t.join();
  if (start_error) std::rethrow_exception(start_error);
  for (std::size_t r = 0; r < un; ++r) {
    if (errors[r] && is_cause[r]) std::rethrow_exception(errors[r]);
  }
  for (std::size_t r = 0; r < un; ++r) {
    if (errors[r]) std::rethrow_exception(errors[r]);
  }
}

}  // namespace cairn::detail
