// cairn/plan/save_plan.hpp: what each rank tells the others before a save, the cross-rank
// access-integrity check, and the deterministic assignment of chunks to files and offsets.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/checksum.hpp"
#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/index.hpp"
#include "cairn/plan/owner.hpp"

namespace cairn {

/// One tensor leaf as other ranks see it: no data, just where its pieces are.
struct tensor_desc {
  std::string key;
  dtype type = dtype::f32;
  shape global_shape;
  int replica_id = 0;
  std::vector<box> pieces;
};

/// One sharded object leaf as other ranks see it.
struct object_desc {
  std::string key;
  shape global_shape;
  shape global_offset;
  int replica_id = 0;
  std::uint64_t nbytes = 0;
};

/// One common value as other ranks see it: its path and a checksum of its typed bytes.
struct common_desc {
  std::string path;
  std::uint64_t hash = 0;
  std::string shown;  ///< the value, shortened (`common_value::str`), for messages
};

/// Everything one rank contributes to the save plan.
struct rank_desc {
  bool checkpoint_exists = false;  ///< rank 0: a committed checkpoint is already there
  std::string save_id;             ///< rank 0's proposal; everyone uses rank 0's
  std::vector<tensor_desc> tensors;
  std::vector<object_desc> objects;
  std::vector<common_desc> commons;
};

/// Serializes a rank's description for the all-gather.
CAIRN_INLINE bytes encode(const rank_desc& d);

/// Inverse of encode(rank_desc); a malformed description is an errc::comm error.
CAIRN_INLINE result<rank_desc> decode_rank_desc(std::span<const std::byte> b);

/// A checksum of a common value's kind, dtype and bytes (used to compare across ranks).
CAIRN_INLINE std::uint64_t common_hash(const common_value& v);

namespace detail {
/// The first 8 of `ranks`, comma-separated, then ",..." when there are more (for messages).
CAIRN_INLINE std::string rank_list(const std::vector<int>& ranks);

/// An errc::integrity error naming checkpoint key `key`.
inline error integrity_error(const std::string& key, std::string msg) {
  return make_error(errc::integrity, std::move(msg)).with_key(key);
}

/// One tensor key as the ranks describe it: dtype and global shape as the first rank listing it
/// has them, and every main-replica piece with its rank.
struct integrity_tensor {
  dtype type;
  shape global_shape;
  int first_rank;
  std::vector<std::pair<box, int>> pieces;  // main replica pieces with their rank
};

/// Gathers each tensor key's main-replica pieces across ranks, checking that every rank gives
/// the key the same dtype and global shape.
CAIRN_INLINE result<std::map<std::string, integrity_tensor>> collect_integrity_tensors(
    const std::vector<rank_desc>& ranks);

/// The axis (of `n`) along which `pieces` have the most distinct offsets; the lowest on ties.
CAIRN_INLINE std::size_t most_distinct_axis(const std::vector<std::pair<box, int>>& pieces,
                                            std::size_t n);

/// Checks that no two main-replica pieces of tensor `key` overlap: sorts `v.pieces` along the
/// axis with the most distinct offsets, then sweeps. A scalar may have only one main piece.
CAIRN_INLINE result<void> check_no_overlap(const std::string& key, integrity_tensor& v);

/// Checks that the main-replica pieces of tensor `key` cover every element of it.
CAIRN_INLINE result<void> check_covered(const std::string& key, const integrity_tensor& v);

/// Checks that every sharded object has one main replica and that each object key's main
/// replicas fill its grid.
CAIRN_INLINE result<void> check_objects(const std::vector<rank_desc>& ranks);

/// The common values not every rank declares (held by a group of ranks: a pipeline stage's
/// optimizer steps, an expert group's counters), each with the lowest rank that declares it;
/// empty when every rank declares the same paths. With `check`, ranks that declare one path
/// must hold one value: a difference is an integrity error naming the path, both ranks and both
/// values. `by_rank[r]` is rank r's common values.
CAIRN_INLINE result<std::map<std::string, int>> common_holders(
    const std::vector<std::vector<common_desc>>& by_rank, bool check);

/// Checks that the ranks that declare a common value agree on it (`common_holders`).
CAIRN_INLINE result<void> check_commons(const std::vector<rank_desc>& ranks);

/// Every check of `validate_integrity` but the common values': tensors' dtypes, shapes, overlaps
/// and coverage, and sharded objects. (A save checks the common values where it finds their
/// holders, `common_holders`, so that they are compared once.)
CAIRN_INLINE result<void> check_layout(const std::vector<rank_desc>& ranks);

/// Even unvalidated, two ranks must not both write one object: one record would be lost.
CAIRN_INLINE result<void> check_unique_objects(const std::vector<rank_desc>& all);
}  // namespace detail

/// Checks that the ranks' leaves fit together (Megatron's validate_access_integrity, and
/// more): per tensor key, dtype and global shape agree on every rank; the main-replica pieces
/// do not overlap and cover every element; sharded objects are not duplicated and fill their
/// grid; the ranks that declare a common value agree on it. Errors name the key and the ranks
/// involved.
CAIRN_INLINE result<void> validate_integrity(const std::vector<rank_desc>& ranks);

/// Where one rank's written item (part of a tensor piece, or an object) goes, and where its
/// bytes come from in that rank's leaves.
struct write_slot {
  bool is_object = false;
  std::string key;           ///< tensor key, or object unique key
  std::size_t chunk = 0;     ///< index into the tensor's chunk list
  std::size_t leaf = 0;      ///< index of the rank's tensor (or object) leaf
  std::size_t piece = 0;     ///< index of the piece inside the tensor leaf
  std::int64_t element = 0;  ///< first element inside the piece's row-major data
};

/// The deterministic save index, format-neutral: every tensor's chunks and every object,
/// with the rank that writes each (`extent::file` is that rank, `byte_offset` the place in what
/// it writes; checksums still empty), and per rank the order of its items. No file names, no
/// format version: a strategy maps this onto its own files.
struct save_index {
  int world_size = 1;
  std::uint64_t block_size = 0;
  std::map<std::string, tensor_record> tensors;
  std::map<std::string, object_record> objects;  ///< by unique key
  std::vector<std::vector<write_slot>> slots;    ///< per rank, in write order
  std::vector<std::uint64_t> bytes_of_rank;      ///< data bytes each rank writes
  /// Only this rank's chunks, objects, slots and bytes (scalable planning, `writer_index`).
  bool partial = false;
  /// Common values held by a group of ranks (not declared by every rank), each with the lowest
  /// rank that declares it: that rank sends rank 0 the value for the commit. Empty when every
  /// rank declares the same common values (rank 0 then saves its own).
  std::map<std::string, int> common_holders;

  /// Whether `rank` writes anything (it has a data file).
  bool writes(int rank) const { return !slots.at(static_cast<std::size_t>(rank)).empty(); }
  /// The extent a slot refers to.
  extent& where(const write_slot& s);
  /// Whether any chunk is cut into tiles.
  bool tiled() const;
};

namespace detail {

/// A rank's tensor piece that holds a box of the save: the rank, its tensor leaf and piece.
struct box_holder {
  int rank;
  std::size_t leaf, piece;
};

/// One box of a tensor, written once, with every rank that holds it.
struct box_group {
  const std::string* key;
  box region;
  std::size_t elem_size;
  std::vector<box_holder> holders;  // the main copy's holder first
  std::uint64_t rotation = 0;       // among equally loaded holders, start at this one (mod size)
  /// Bytes of the box.
  std::uint64_t bytes() const { return static_cast<std::uint64_t>(region.volume()) * elem_size; }
};

/// A part of a box written by one of its holders.
struct write_part {
  std::size_t group;
  box_holder who;
  piece sub;  // sub-box and its first element inside the holder's piece
};

/// Records every tensor's dtype and global shape in `L.tensors` and collects its boxes: main
/// copies first, then replicas that hold exactly a main box.
CAIRN_INLINE std::vector<box_group> collect_box_groups(const std::vector<rank_desc>& ranks,
                                                       save_index& L,
                                                       bool rotate = false);

/// Indices of `groups`, largest box first (ties in key and box order, so every rank agrees).
CAIRN_INLINE std::vector<std::size_t> largest_first(const std::vector<box_group>& groups);

/// How many parts box `g` is cut into: parts of at least `split_min_bytes`, at most one per
/// holder and one per element, at least one.
CAIRN_INLINE std::size_t part_count(const box_group& g, std::uint64_t split_min_bytes);

/// The holder of `g` not yet `used` whose rank has written least so far (on ties, the first
/// counting from `g.rotation`).
CAIRN_INLINE std::size_t least_loaded_holder(const box_group& g,
                                             const std::vector<bool>& used,
                                             const std::vector<std::uint64_t>& bytes_of_rank);

/// Cuts every box, largest first, into `part_count` contiguous parts, each given to the
/// least-loaded holder not yet used for that box; adds the bytes to `bytes_of_rank`.
CAIRN_INLINE std::vector<write_part> balance_parts(const std::vector<box_group>& groups,
                                                   std::uint64_t split_min_bytes,
                                                   std::vector<std::uint64_t>& bytes_of_rank);

/// Sorts `parts` into chunk order (key, then box, then position in the box) and appends each as
/// a chunk of its tensor at `offset[rank]` of its rank's bytes (tiled when `tile`), with its slot.
CAIRN_INLINE void place_chunks(std::vector<write_part>& parts,
                               const std::vector<box_group>& groups,
                               std::uint64_t block_size,
                               tiling tile,
                               std::vector<std::uint64_t>& offset,
                               save_index& L);

/// Appends every main-replica sharded object at `offset[rank]` of its rank's bytes, with its
/// slot, and counts its bytes in `L.bytes_of_rank`.
CAIRN_INLINE void place_objects(const std::vector<rank_desc>& ranks,
                                std::vector<std::uint64_t>& offset,
                                save_index& L);

}  // namespace detail

/// Lays out a save. Every box of a tensor is written once, by the ranks that hold it: a box
/// held by k ranks (its main copy and replicas, e.g. data-parallel copies) is cut into up to k
/// contiguous parts of at least `split_min_bytes`, written by different ranks; a box smaller
/// than that goes whole to the least-loaded holder. Boxes are placed largest first, each part on
/// the holder that has written least so far, so every rank writes about the same amount. Every rank
/// computes the same index from the same descriptions. With `tile` on, every written box larger
/// than a checksum block is cut into tiles of at most one block (`choose_tiles`), so that a
/// reader that needs only some columns reads only the tiles holding them; with `tile` > 1
/// (`index_slabs`) also into that many slabs along its sharded axes.
///
/// With `rotate`, ties between equally loaded holders start at a holder picked by a hash of
/// the key, so that planners that each see only some keys (plan/scalable.hpp) still spread the
/// writes over every holder.
CAIRN_INLINE save_index plan_save(const std::vector<rank_desc>& ranks,
                                  std::uint64_t block_size,
                                  std::uint64_t split_min_bytes = std::uint64_t{1} << 20,
                                  tiling tile = block_tiles,
                                  bool rotate = false);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/plan/save_plan-inl.hpp"
#endif
