// cairn/save.hpp: saving a state tree from every rank (`save`, `try_save`). The phases live in
// cairn/pipeline/save.hpp, the native format's writer in cairn/format/native/.
#pragma once

#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/options.hpp"
#include "cairn/storage/storage.hpp"
#include "cairn/tree/leaves.hpp"
#include "cairn/tree/visit.hpp"

namespace cairn {

namespace detail {
/// The non-template body of `save`: plan, write and commit the leaves (the phases are in
/// cairn/pipeline/save.hpp).
CAIRN_INLINE result<save_stats> save_leaves(const leaf_list& leaves,
                                            storage_ref st,
                                            comm_ref comm,
                                            const save_options& requested);
}  // namespace detail

/// Saves `tree` from this rank; every rank of `comm` calls it with its own shards. Returns
/// this rank's statistics or the first error any rank hit (the same error on every rank).
/// The checkpoint is committed (metadata.json written last, atomically) only when every rank
/// succeeded; a failed save leaves any previous checkpoint in `st` loadable.
template <class Tree>
result<save_stats> try_save(const Tree& tree,
                            storage_ref st,
                            comm_ref comm,
                            const save_options& opt = {}) {
  // Visiting needs non-const access to build leaf views; save never writes through them.
  try {
    leaf_list leaves = flatten(const_cast<Tree&>(tree));
    return detail::save_leaves(leaves, st, comm, opt);
  } catch (...) {
    return detail::current_exception_error("saving").with_rank(comm.rank());
  }
}

/// Throwing form of `try_save`: returns statistics or throws `cairn::exception`.
template <class Tree>
save_stats save(const Tree& tree, storage_ref st, comm_ref comm, const save_options& opt = {}) {
  return try_save(tree, st, comm, opt).value();
}

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/pipeline/save.hpp"  // the phases, with their bodies and save_leaves'
#endif
