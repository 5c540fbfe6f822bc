// cairn/pipeline/load-inl.hpp: the bodies of cairn/pipeline/load.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "cairn/comm/agree.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/detail/parallel.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/pipeline/load.hpp"
#include "cairn/pipeline/load_cache.hpp"
#include "cairn/pipeline/stage.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/plan/owner.hpp"
#include "cairn/storage/decorator.hpp"

namespace cairn::detail {

/// Counts the bytes read through it: the index sections a load reads, for
/// load_stats::index_bytes_read.
class read_counting_storage : public storage_decorator<storage_ref> {
 public:
  read_counting_storage(storage_ref& inner, std::uint64_t& bytes) noexcept
      : storage_decorator(inner), bytes_(&bytes) {}
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    auto r = storage_decorator::read(name, offset, out);
    if (r) *bytes_ += out.size();
    return r;
  }

 private:
  std::uint64_t* bytes_;
};

CAIRN_INLINE result<checkpoint_metadata> read_metadata_collective(storage_ref st, comm_ref comm) {
  std::optional<error> failure;
  bytes said;
  if (comm.rank() == 0) {
    auto m = catch_all("reading the metadata", [&] { return read_any_metadata_json(st); });
    if (!m) failure = m.err();
    said = encode_message(metadata_message{m && m->foreign, m ? m->json : std::string()});
  }
  auto [root_failure, payload] = announce(comm, 0, failure, said);
  if (root_failure) return std::move(*root_failure);
  CAIRN_TRY_ASSIGN(metadata_message got, decode_message<metadata_message>(payload));
  return metadata_from_json(got.json, st.describe(metadata_name), /*allow_unverified=*/got.foreign);
}

CAIRN_INLINE result<void> load_commons(const leaf_list& leaves,
                                       storage_ref st,
                                       const checkpoint_metadata& m,
                                       const load_options& opt) {
  if (leaves.commons.empty() && !opt.client_state) return ok();
  CAIRN_TRY_ASSIGN(auto commons, read_commons(st, m));
  if (opt.client_state) {
    opt.client_state->clear();
    std::set<std::string> declared;
    for (const auto& c : leaves.commons) declared.insert(c.path);
    for (const auto& [path, v] : commons)
      if (!declared.count(path)) opt.client_state->emplace(path, v);
  }
  for (const auto& c : leaves.commons) {
    auto it = commons.find(c.path);
    if (it == commons.end())
      return make_error(errc::not_found, "common value is not in the checkpoint").with_key(c.path);
    const common_value* stored = &it->second;
    std::optional<common_value> coerced;
    if (m.inline_commons.count(c.path)) {
      // A foreign format stores Python values (int, float, bool): take them as the target's
      // dtype when they fit exactly.
      common_value want = c.encode(c.value);
      if (want.kind == stored->kind && (coerced = coerce_common(*stored, want.type)))
        stored = &*coerced;
    }
    if (auto d = c.decode(*stored, c.value); !d) return std::move(d).err().with_key(c.path);
  }
  return ok();
}

CAIRN_INLINE result<const tensor_record*> matching_record(const tensor_leaf& t,
                                                          const checkpoint_metadata& m,
                                                          bool cast_floats) {
  const tensor_sharding& L = t.sharding;
  auto it = m.tensors.find(L.key);
  if (it == m.tensors.end())
    return make_error(errc::not_found,
                      "tensor is not in the checkpoint (which holds " +
                          std::to_string(m.tensors.size()) +
                          (m.tensors.size() == 1 ? " tensor" : " tensors") +
                          "): leave it out of the tree, or set load_options::strict to "
                          "strict_mode::log_unexpected or return_unexpected to skip what the "
                          "checkpoint lacks")
        .with_key(L.key);
  const tensor_record& rec = it->second;
  if (m.index_refs.count(L.key))  // a reader's bug, never the file's: refuse to load nothing
    return make_error(errc::invalid_argument,
                      "the tensor's index section was not read (read_index_sections)")
        .with_key(L.key);
  const bool castable = cast_floats && convertible_float(rec.type) && convertible_float(L.type);
  if (rec.type != L.type && !castable)
    return make_error(errc::mismatch,
                      "checkpoint holds " + std::string(dtype_name(rec.type)) + ", the target is " +
                          std::string(dtype_name(L.type)) +
                          (cast_floats ? " (load_options::cast_floats converts only between f16, "
                                         "bf16, f32 and f64)"
                                       : " (cairn never converts silently: "
                                         "load_options::cast_floats converts floating dtypes)"))
        .with_key(L.key);
  std::size_t es = dtype_size(L.type);
  if (t.nbytes % es != 0)
    return make_error(errc::invalid_argument, "data size is not a multiple of the element size")
        .with_key(L.key);
  CAIRN_TRY(validate_sharding(L, t.nbytes / es));
  if (rec.global_shape != L.global_shape) {
    if (!L.allow_shape_mismatch || rec.global_shape.size() != L.global_shape.size()) {
      bool larger = rec.global_shape.size() == L.global_shape.size();
      for (std::size_t d = 0; larger && d < L.global_shape.size(); ++d)
        larger = L.global_shape[d] >= rec.global_shape[d];
      return make_error(
                 errc::mismatch,
                 "global shape " + shape_str(rec.global_shape) + " in the checkpoint, " +
                     shape_str(L.global_shape) + " in the target: " +
                     (larger ? std::string("set allow_shape_mismatch to load into this larger "
                                           "(padded) tensor")
                             : std::string("describe the saved shape; to split an axis over "
                                           "any number of ranks use cairn::even_block "
                                           "(size / ranks rows per rank drops the remainder)")))
          .with_key(L.key);
    }
    std::memset(t.data, 0, t.nbytes);
  }
  return &rec;
}

CAIRN_INLINE result<std::vector<copy_job>> plan_tensor_copies(const leaf_list& leaves,
                                                              const checkpoint_metadata& m,
                                                              const std::set<piece_ref>& skip,
                                                              bool cast_floats,
                                                              std::vector<std::string>* cast) {
  std::vector<copy_job> jobs;
  for (std::size_t ti = 0; ti < leaves.tensors.size(); ++ti) {
    const tensor_leaf& t = leaves.tensors[ti];
    CAIRN_TRY_ASSIGN(const tensor_record* rec, matching_record(t, m, cast_floats));
    if (rec->type != t.sharding.type && cast &&
        std::find(cast->begin(), cast->end(), t.sharding.key) == cast->end())
      cast->push_back(t.sharding.key);
    const std::size_t es = dtype_size(t.sharding.type);
    auto ps = pieces_of(t.sharding);
    const std::size_t first = jobs.size();
    for (std::size_t pi = 0; pi < ps.size(); ++pi)
      if (!skip.count({ti, pi}))
        CAIRN_TRY(plan_copies(*rec, t.sharding.key, ps[pi].region, t.data + ps[pi].data_offset * es,
                              jobs));
    for (std::size_t j = first; j < jobs.size(); ++j) {
      jobs[j].on_device = t.on_device;
      jobs[j].target_type = t.sharding.type;
    }
  }
  return jobs;
}

CAIRN_INLINE result<const object_record*> find_saved_object(const object_leaf& o,
                                                            const checkpoint_metadata& m,
                                                            const load_options& opt) {
  std::string u = object_unique_key(o.key, o.global_offset, o.global_shape);
  if (auto it = m.objects.find(u); it != m.objects.end()) return &it->second;
  for (const auto& [k, rec] : m.objects) {
    if (rec.key != o.key || rec.global_shape == o.global_shape) continue;
    if (!opt.object_mapping)
      return make_error(errc::mismatch,
                        "sharded object was saved as a grid of " + shape_str(rec.global_shape) +
                            " (world size " + std::to_string(m.world_size) +
                            "), this rank asks for " + u +
                            ": the topology changed; set load_options::object_mapping "
                            "(cairn::objects_modulo() gives rank r what rank r % saved ranks "
                            "saved), give the object a grid that exists in the checkpoint, or "
                            "leave it out of the tree")
          .with_key(o.key);
    auto at = opt.object_mapping(o.key, rec.global_shape, o.global_offset, o.global_shape);
    if (!at) return static_cast<const object_record*>(nullptr);  // leave the value as it is
    std::string mapped = object_unique_key(o.key, *at, rec.global_shape);
    auto it = m.objects.find(mapped);
    if (it == m.objects.end())
      return make_error(errc::not_found, "object_mapping maps " + u + " to " + mapped +
                                             ", which is not in the checkpoint")
          .with_key(o.key);
    return &it->second;
  }
  return make_error(errc::not_found, "sharded object " + u + " is not in the checkpoint")
      .with_key(o.key);
}

CAIRN_INLINE result<void> load_objects(const leaf_list& leaves,
                                       storage_ref st,
                                       const checkpoint_metadata& m,
                                       const load_options& opt,
                                       load_stats& stats) {
  for (const auto& o : leaves.objects) {
    CAIRN_TRY_ASSIGN(const object_record* rec, find_saved_object(o, m, opt));
    if (!rec) continue;
    std::string u = object_unique_key(o.key, o.global_offset, o.global_shape);
    CAIRN_TRY_ASSIGN(auto buf, read_extent(st, m, rec->where, o.key, "object " + u));
    stats.bytes_read += buf.size();
    if (auto d = o.decode(buf, o.value); !d) return std::move(d).err().with_key(o.key);
  }
  if (!opt.client_objects) return ok();
  opt.client_objects->clear();
  std::set<std::string> declared;
  for (const auto& o : leaves.objects) declared.insert(o.key);
  for (const auto& [u, rec] : m.objects) {
    if (declared.count(rec.key)) continue;
    CAIRN_TRY_ASSIGN(auto buf, read_extent(st, m, rec.where, rec.key, "object " + u));
    stats.bytes_read += buf.size();
    opt.client_objects->emplace(u, std::move(buf));
  }
  return ok();
}

CAIRN_INLINE result<void> load_leaves_local(const leaf_list& leaves,
                                            storage_ref st,
                                            const checkpoint_metadata& m,
                                            const load_options& opt,
                                            load_stats& stats,
                                            const std::set<piece_ref>& skip,
                                            buffer_pool* pool,
                                            cuda::staging_window* window) {
  CAIRN_TRY(load_commons(leaves, st, m, opt));
  if (opt.common_only) return ok();
  auto jobs = plan_tensor_copies(leaves, m, skip, opt.cast_floats, &stats.cast);
  if (!jobs) return std::move(jobs).err().with_file(st.describe(""));  // which checkpoint
  read_counts counts;
  auto copied = run_copies(st, m, *jobs, opt.io_threads, counts, pool, &opt.progress, window);
  stats.bytes_needed += counts.bytes_needed;
  stats.bytes_read += counts.bytes_read;
  CAIRN_TRY(std::move(copied));
  return load_objects(leaves, st, m, opt, stats);
}

CAIRN_INLINE std::set<std::string> checkpoint_keys(const checkpoint_metadata& m) {
  std::set<std::string> keys;
  for (const auto& [k, t] : m.tensors) keys.insert(k);
  for (const auto& [u, o] : m.objects) keys.insert(o.key);
  for (const auto& [k, c] : m.commons) keys.insert(k);
  for (const auto& [k, c] : m.inline_commons) keys.insert(k);  // e.g. Megatron's common.pt
  return keys;
}

CAIRN_INLINE result<void> apply_strict(leaf_list& leaves,
                                       const checkpoint_metadata& m,
                                       comm_ref comm,
                                       const load_options& opt,
                                       load_stats& stats) {
  if (opt.strict == strict_mode::assume_ok_unexpected) return ok();
  const std::set<std::string> saved = checkpoint_keys(m);
  const std::set<std::string> requested = drop_unexpected(leaves, saved, stats);
  if (wants_missing(opt.strict)) {
    const bytes mine = encode_message(std::vector<std::string>(requested.begin(), requested.end()));
    std::set<std::string> everyone;
    const std::vector<bytes> all = comm.all_gather(mine);
    for (std::size_t r = 0; r < all.size(); ++r) {
      result<std::vector<std::string>> keys =
          decode_message<std::vector<std::string>>(all[r], "list of requested keys");
      if (!keys) return std::move(keys).err().with_rank(static_cast<int>(r));
      everyone.insert(keys->begin(), keys->end());
    }
    for (const auto& k : saved)
      if (!everyone.count(k)) stats.missing.push_back(k);
  }
  return report_strict(opt, comm.rank(), stats);
}

CAIRN_INLINE result<void> agree_on_load(comm_ref comm, const std::optional<error>& failure) {
  if (auto f = agree(comm, failure).first_failure()) return std::move(*f);
  return ok();
}

CAIRN_INLINE result<void> load_leaves_from(const leaf_list& tree_leaves,
                                           checkpoint_metadata& m,
                                           storage_ref st,
                                           comm_ref comm,
                                           const load_options& opt,
                                           load_stats& stats) {
  leaf_list leaves = select_leaves(tree_leaves, opt);
  std::optional<error> failure;
  if (auto s = apply_strict(leaves, m, comm, opt, stats); !s)
    failure = std::move(s).err().with_rank(comm.rank());
  // Device tensors load through a bounded window of host staging memory, piece by piece.
  device_leaf_staging device(opt.staging);
  cuda::staging_window* window = nullptr;
  if (!failure && !opt.common_only) {
    auto w = device.open_window(leaves, opt.cuda_runtime, opt.staging_window,
                                load_window_granularity, opt.io_threads);
    if (w)
      window = *w;
    else
      failure = std::move(w).err().with_rank(comm.rank());
  }
  // Pieces several ranks ask for alike are read by one of them and passed on (collective: every
  // rank plans).
  const std::vector<shared_piece> shared = plan_shared_pieces(leaves, m, comm, opt);
  const std::set<piece_ref> skip = received_pieces(shared);
  if (!failure && !opt.common_only && !m.index_refs.empty()) {
    // Format version 4: only the index pages that meet this rank's pieces are read.
    index_wants wants;
    for (const auto& t : leaves.tensors) {
      auto& boxes = wants[t.sharding.key];
      for (const auto& p : pieces_of(t.sharding)) boxes.push_back(p.region);
      if (boxes.empty()) boxes.push_back(box{shape(t.sharding.global_shape.size(), 0), {}});
    }
    const std::string where = st.describe("");
    const checkpoint_metadata* cached =
        opt.plan_cache ? load_plan_cache_access::find(*opt.plan_cache, where, m.save_id, wants)
                       : nullptr;
    if (cached) {
      m = *cached;
      stats.index_reused = true;
    } else {
      read_counting_storage counted(st, stats.index_bytes_read);
      auto r = catch_all("reading the index",
                         [&] { return read_index_sections(storage_ref(counted), m, wants); });
      if (!r)
        failure = std::move(r).err().with_rank(comm.rank());
      else if (opt.plan_cache)
        load_plan_cache_access::store(*opt.plan_cache, where, m.save_id, std::move(wants), m);
    }
  }
  if (!failure) {
    auto r = catch_all("loading", [&] {
      return load_leaves_local(leaves, st, m, opt, stats, skip, nullptr, window);
    });
    if (!r) failure = std::move(r).err().with_rank(comm.rank());
  }
  // Delivered only when every rank is ready (every reader holds its pieces); when some rank is
  // not, the rest is moot: every rank learns its failure.
  result<bool> delivered =
      deliver_shared_pieces(shared, leaves, comm, opt, !failure, stats, window);
  if (!delivered && !failure) failure = std::move(delivered).err();
  if (delivered && !*delivered) return agree_on_load(comm, failure);
  if (!failure) {
    auto r = catch_all("loading", [&]() -> result<void> {
      if (opt.common_only) return ok();
      for (const auto& merge : leaves.after_load) CAIRN_TRY(merge());
      return ok();
    });
    if (!r) failure = std::move(r).err().with_rank(comm.rank());
  }
  return agree_on_load(comm, failure);
}

CAIRN_INLINE result<load_stats> load_leaves(const leaf_list& tree_leaves,
                                            storage_ref st,
                                            comm_ref comm,
                                            const load_options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  load_stats stats;
  CAIRN_TRY_ASSIGN(checkpoint_metadata m, read_metadata_collective(st, comm));
  CAIRN_TRY(load_leaves_from(tree_leaves, m, st, comm, opt, stats));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace cairn::detail
