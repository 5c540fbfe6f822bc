// cairn/pipeline/save-inl.hpp: the bodies of cairn/pipeline/save.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <simdjson.h>
#include <zstd.h>

#include <chrono>
#include <map>
#include <random>
#include <set>

#include "cairn/comm/agree.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/pipeline/save.hpp"
#include "cairn/pipeline/stage.hpp"

namespace cairn::detail {

CAIRN_INLINE std::string new_save_id() {
  std::random_device rd;
  std::uint64_t x =
      (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return checksum_hex(x).substr(0, 12);
}

CAIRN_INLINE const save_strategy& strategy_of(const save_options& opt) {
  static const native_strategy native;
  return opt.strategy ? *opt.strategy : native;
}

CAIRN_INLINE result<void> recording_storage::put(std::string_view name,
                                                 std::span<const std::byte> data) {
  auto r = inner_.put(name, data);
  if (r) record(name);
  return r;
}

CAIRN_INLINE result<std::unique_ptr<object_writer>> recording_storage::open_writer(
    std::string_view name) {
  CAIRN_TRY_ASSIGN(auto w, inner_.open_writer(name));
  return std::unique_ptr<object_writer>(
      std::make_unique<recording_writer>(std::move(w), *this, std::string(name)));
}

CAIRN_INLINE result<void> recording_storage::remove(std::string_view name) {
  auto r = inner_.remove(name);
  if (r) {
    std::lock_guard lock(mu_);
    std::erase(names_, std::string(name));
  }
  return r;
}

CAIRN_INLINE std::vector<std::string> recording_storage::names() const {
  std::vector<std::string> out;
  {
    std::lock_guard lock(mu_);
    out = names_;
  }
  std::erase_if(out, [&](const std::string& n) {
    auto there = inner_.exists(n);
    return there && !*there;
  });
  return out;
}

CAIRN_INLINE result<void> recording_storage::recording_writer::finish() {
  auto r = w_->finish();
  if (r) owner_.record(name_);
  return r;
}

CAIRN_INLINE void recording_storage::record(std::string_view name) {
  std::lock_guard lock(mu_);
  std::erase(names_, std::string(name));  // written again (an overwrite): listed once, last
  names_.emplace_back(name);
}

CAIRN_INLINE save_options effective_options(const save_options& opt) {
  save_options eff = opt;
  eff.index_files = opt.index_files && strategy_of(opt).features(opt).routes;
  return eff;
}

CAIRN_INLINE result<void> check_save_options(const save_options& opt) {
  if (opt.block_size == 0 || opt.block_size > max_block_size)
    return make_error(errc::invalid_argument,
                      "block_size must be between 1 and " + std::to_string(max_block_size));
  if (opt.staging_window != 0 && opt.staging_window < opt.block_size)
    return make_error(errc::invalid_argument,
                      "staging_window (" + std::to_string(opt.staging_window) +
                          " bytes) must hold at least one checksum block (block_size, " +
                          std::to_string(opt.block_size) + ")");
  if (opt.zstd_level < 0 || opt.zstd_level > ZSTD_maxCLevel())
    return make_error(errc::invalid_argument,
                      "zstd_level must be 0 (off) to " + std::to_string(ZSTD_maxCLevel()));
  return ok();
}

CAIRN_INLINE result<void> check_utf8_names(const leaf_list& leaves, const save_options& opt) {
  auto check = [](const std::string& s, const char* what) -> result<void> {
    if (!simdjson::validate_utf8(s.data(), s.size()))
      return make_error(errc::invalid_argument, std::string(what) + " is not valid UTF-8")
          .with_key(s);
    return ok();
  };
  for (const auto& t : leaves.tensors) CAIRN_TRY(check(t.sharding.key, "tensor key"));
  for (const auto& o : leaves.objects) CAIRN_TRY(check(o.key, "object key"));
  for (const auto& c : leaves.commons) CAIRN_TRY(check(c.path, "common value path"));
  for (const auto& [k, v] : opt.content_metadata) {
    CAIRN_TRY(check(k, "content metadata key"));
    CAIRN_TRY(check(v, "content metadata value"));
  }
  return ok();
}

CAIRN_INLINE result<std::vector<std::vector<piece>>> describe_rank(const leaf_list& leaves,
                                                                   storage_ref st,
                                                                   const save_options& opt,
                                                                   planned_save& out,
                                                                   rank_desc& me) {
  CAIRN_TRY(check_utf8_names(leaves, opt));
  std::vector<std::vector<piece>> pieces(leaves.tensors.size());
  for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
    const tensor_leaf& t = leaves.tensors[i];
    std::size_t es = dtype_size(t.sharding.type);
    if (t.nbytes % es != 0)
      return make_error(errc::invalid_argument, "data size is not a multiple of the element size")
          .with_key(t.sharding.key);
    CAIRN_TRY(validate_sharding(t.sharding, t.nbytes / es));
    pieces[i] = pieces_of(t.sharding);
    tensor_desc d{
        t.sharding.key, t.sharding.type, t.sharding.global_shape, t.sharding.replica_id, {}};
    for (const auto& p : pieces[i]) d.pieces.push_back(p.region);
    me.tensors.push_back(std::move(d));
  }
  for (const auto& o : leaves.objects) {
    bytes b = o.replica_id == 0 ? o.encode(o.value) : bytes{};
    me.objects.push_back(
        object_desc{o.key, o.global_shape, o.global_offset, o.replica_id, b.size()});
    out.object_bytes.push_back(std::move(b));
  }
  for (const auto& c : leaves.commons) out.commons.emplace_back(c.path, c.encode(c.value));
  if (opt.preprocess_common) {
    std::map<std::string, common_value> check(out.commons.begin(), out.commons.end());
    opt.preprocess_common(check);
    for (const auto& [path, v] : check)
      me.commons.push_back(common_desc{path, common_hash(v), v.str(40)});
  } else {
    for (const auto& [path, v] : out.commons)
      me.commons.push_back(common_desc{path, common_hash(v), v.str(40)});
  }
  CAIRN_TRY(strategy_of(opt).check(leaves));
  if (out.rank == 0) {
    // Any committed format counts: a save never writes over a checkpoint of another kind.
    CAIRN_TRY_ASSIGN(std::string format, detect_format(st));
    me.checkpoint_exists = !format.empty();
    me.save_id = new_save_id();
  }
  return pieces;
}

CAIRN_INLINE bool plans_by_key_owners(const save_options& o, int world_size) {
  if (o.scalable_planning) return *o.scalable_planning;
  return world_size >= key_owner_planning_min_ranks && strategy_of(o).features(o).plans_at_scale;
}

CAIRN_INLINE plan_settings settings_of(const save_options& o, int world_size) {
  plan_settings s;
  s.block_size = o.block_size;
  s.balance_min_bytes = o.balance_min_bytes;
  s.tile = o.tile;
  s.scalable = plans_by_key_owners(o, world_size);
  s.index_files = o.index_files;
  s.strategy = o.strategy;
  s.validated = o.validate_access_integrity;
  return s;
}

CAIRN_INLINE result<void> vote_on_cached_plan(const rank_desc& me,
                                              const std::optional<error>& failure,
                                              save_plan_cache& cache,
                                              comm_ref comm,
                                              const save_options& opt,
                                              agreed_plan& out) {
  std::uint64_t commons_digest = 0;
  for (const auto& c : me.commons) commons_digest = commons_digest * 1099511628211ull ^ c.hash;
  // A plan with group-held common values cannot compare one digest per rank with rank 0's (the
  // ranks declare different values): each rank sends its values' hashes, compared per path.
  const bool by_group = !plan_cache_access::cached(cache).common_holders.empty();
  const bytes vote = encode_message(plan_vote_message{
      structure_hash(me), commons_digest, by_group ? me.commons : std::vector<common_desc>{}});
  auto decide = [&](const std::vector<bytes>& votes) {
    bool same = true;
    std::uint64_t digest0 = 0;
    std::vector<std::vector<common_desc>> commons;
    for (std::size_t r = 0; r < votes.size(); ++r) {
      result<plan_vote_message> v = decode_message<plan_vote_message>(votes[r]);
      if (!v)
        return std::pair{std::optional<error>(std::move(v).err().with_rank(static_cast<int>(r))),
                         bytes{}};
      if (r == 0) digest0 = v->commons_digest;
      same = same && v->structure == plan_cache_access::structure(cache).at(r) &&
             (by_group || !opt.validate_access_integrity || v->commons_digest == digest0);
      commons.push_back(std::move(v->commons));
    }
    if (same && by_group && opt.validate_access_integrity)
      if (auto held = common_holders(commons, true); !held)
        return std::pair{std::optional<error>(std::move(held).err()), bytes{}};
    return std::pair{std::optional<error>{},
                     encode_message(plan_verdict_message{same, me.checkpoint_exists, me.save_id})};
  };
  auto [verdict, payload] = agree_at_root(comm, 0, failure, vote, decide);
  if (verdict) return std::move(*verdict);
  CAIRN_TRY_ASSIGN(plan_verdict_message said, decode_message<plan_verdict_message>(payload));
  const bool same = said.same;
  out.exists_at_root = said.checkpoint_exists;
  out.save_id = std::move(said.save_id);
  if (same) out.cached = plan_cache_access::hit(cache);
  return ok();
}

CAIRN_INLINE result<void> check_overwrite(bool exists_at_root,
                                          storage_ref st,
                                          const save_options& opt) {
  if (!exists_at_root) return ok();
  if (!opt.overwrite)
    return make_error(errc::already_exists,
                      "a committed checkpoint already exists here; pass "
                      "save_options{.overwrite = true} to replace it")
        .with_file(st.describe(metadata_name));
  if (!strategy_of(opt).features(opt).can_overwrite)
    return make_error(errc::already_exists,
                      "a committed checkpoint already exists here and the " +
                          std::string(strategy_of(opt).name()) +
                          " strategy cannot replace one in place (its file names are fixed); "
                          "save to a new place")
        .with_file(st.describe(""));
  return ok();
}

CAIRN_INLINE result<save_index> plan_everywhere(const rank_desc& me,
                                                const std::optional<error>& failure,
                                                storage_ref st,
                                                comm_ref comm,
                                                const save_options& opt,
                                                save_stats& stats) {
  rank_statuses descs = agree(comm, failure, encode(me));
  if (auto f = descs.first_failure()) return std::move(*f);
  std::vector<rank_desc> all;
  for (std::size_t r = 0; r < descs.payloads.size(); ++r) {
    result<rank_desc> d = decode_rank_desc(descs.payloads[r]);
    if (!d) return std::move(d).err().with_rank(static_cast<int>(r));
    all.push_back(std::move(*d));
  }
  CAIRN_TRY(check_overwrite(all[0].checkpoint_exists, st, opt));
  stats.save_id = all[0].save_id;
  if (opt.validate_access_integrity)
    CAIRN_TRY(check_layout(all));
  else
    CAIRN_TRY(check_unique_objects(all));
  // The common values are compared (when validating) where their holders are found: once.
  std::vector<std::vector<common_desc>> commons;
  for (const auto& d : all) commons.push_back(d.commons);
  CAIRN_TRY_ASSIGN(auto holders, common_holders(commons, opt.validate_access_integrity));
  save_index index =
      plan_save(all, opt.block_size, opt.balance_min_bytes, strategy_of(opt).features(opt).tile);
  index.common_holders = std::move(holders);
  if (opt.plan_cache) {
    std::vector<std::uint64_t> per_rank;
    for (const auto& d : all) per_rank.push_back(structure_hash(d));
    plan_cache_access::store(*opt.plan_cache, comm.size(), settings_of(opt, comm.size()),
                             std::move(per_rank), index);
  }
  return index;
}

CAIRN_INLINE result<save_index> plan_at_scale(const rank_desc& me,
                                              const std::optional<error>& failure,
                                              storage_ref st,
                                              comm_ref comm,
                                              const save_options& opt,
                                              save_stats& stats) {
  CAIRN_TRY_ASSIGN(scalable_agreement a,
                   scalable_plan(me, failure, comm, opt.validate_access_integrity, opt.block_size,
                                 opt.balance_min_bytes, strategy_of(opt).features(opt).tile,
                                 structure_hash(me)));
  CAIRN_TRY(check_overwrite(a.exists_at_root, st, opt));
  stats.save_id = a.save_id;
  if (opt.plan_cache)
    plan_cache_access::store(*opt.plan_cache, comm.size(), settings_of(opt, comm.size()),
                             std::move(a.structure_of_rank), a.index);
  return std::move(a.index);
}

CAIRN_INLINE result<save_index> agree_on_index(const rank_desc& me,
                                               const std::optional<error>& failure,
                                               storage_ref st,
                                               comm_ref comm,
                                               const save_options& opt,
                                               save_stats& stats) {
  if (opt.scalable_planning.value_or(false) && !strategy_of(opt).features(opt).plans_at_scale)
    return make_error(errc::invalid_argument,
                      "save_options::scalable_planning needs a strategy that plans at scale; " +
                          std::string(strategy_of(opt).name()) + " does not");
  save_plan_cache* cache = opt.plan_cache;
  if (cache && plan_cache_access::usable(*cache, comm.size(), settings_of(opt, comm.size()))) {
    agreed_plan agreed;
    CAIRN_TRY(vote_on_cached_plan(me, failure, *cache, comm, opt, agreed));
    if (agreed.cached) {
      CAIRN_TRY(check_overwrite(agreed.exists_at_root, st, opt));
      stats.save_id = agreed.save_id;
      stats.plan_reused = true;
      return std::move(*agreed.cached);
    }
  }
  if (plans_by_key_owners(opt, comm.size()))
    return plan_at_scale(me, failure, st, comm, opt, stats);
  return plan_everywhere(me, failure, st, comm, opt, stats);
}

CAIRN_INLINE result<void> gather_held_commons(planned_save& out, comm_ref comm) {
  held_commons_message mine;
  if (out.rank != 0)
    for (const auto& [path, v] : out.commons)
      if (auto h = out.index.common_holders.find(path);
          h != out.index.common_holders.end() && h->second == out.rank)
        mine.values.emplace_back(path, v);
  auto [failure, unused] = agree_at_root(
      comm, 0, std::nullopt, encode_message(mine), [&](const std::vector<bytes>& sent) {
        std::set<std::string> have;
        for (const auto& [path, v] : out.commons) have.insert(path);
        for (std::size_t r = 1; r < sent.size(); ++r) {
          result<held_commons_message> m = decode_message<held_commons_message>(sent[r]);
          if (!m)
            return std::pair{
                std::optional<error>(std::move(m).err().with_rank(static_cast<int>(r))), bytes{}};
          // Rank 0 keeps its own value of a path its preprocess_common hid from the comparison.
          for (auto& [path, v] : m->values)
            if (have.insert(path).second) out.commons.emplace_back(std::move(path), std::move(v));
        }
        return std::pair{std::optional<error>{}, bytes{}};
      });
  if (failure) return std::move(*failure);
  return ok();
}

CAIRN_INLINE void list_items(const leaf_list& leaves,
                             const std::vector<std::vector<piece>>& pieces,
                             planned_save& out) {
  out.items.clear();
  for (const write_slot& slot : out.index.slots[out.rank]) {
    const extent& e = out.index.where(slot);
    if (slot.is_object) {
      out.items.push_back(write_item{.src = out.object_bytes[slot.leaf].data(),
                                     .nbytes = e.nbytes,
                                     .file_offset = e.byte_offset,
                                     .key = leaves.objects[slot.leaf].key,
                                     .checksums = {},
                                     .region = {},
                                     .tiles = {},
                                     .elem_size = 1,
                                     .is_object = true});
      continue;
    }
    const tensor_leaf& t = leaves.tensors[slot.leaf];
    std::size_t es = dtype_size(t.sharding.type);
    const piece& p = pieces[slot.leaf][slot.piece];
    const chunk_record& c = out.index.tensors.at(slot.key).chunks.at(slot.chunk);
    out.items.push_back(write_item{.src = t.data + (p.data_offset + slot.element) * es,
                                   .nbytes = e.nbytes,
                                   .file_offset = e.byte_offset,
                                   .key = t.sharding.key,
                                   .checksums = {},
                                   .region = c.region,
                                   .tiles = c.tiles,
                                   .elem_size = es,
                                   .is_object = false,
                                   .on_device = t.on_device});
  }
}

CAIRN_INLINE result<void> plan_phase(const leaf_list& leaves,
                                     storage_ref st,
                                     comm_ref comm,
                                     const save_options& opt,
                                     planned_save& out,
                                     const std::optional<error>& local_failure) {
  out.start = std::chrono::steady_clock::now();
  out.rank = comm.rank();
  out.stats = save_stats{};
  out.object_bytes.clear();
  out.commons.clear();
  CAIRN_TRY(check_save_options(opt));
  rank_desc me;
  std::optional<error> failure = local_failure;
  std::vector<std::vector<piece>> pieces;
  if (!failure) {
    auto d =
        catch_all("planning the save", [&] { return describe_rank(leaves, st, opt, out, me); });
    if (d)
      pieces = std::move(*d);
    else
      failure = std::move(d).err();
  }
  CAIRN_TRY_ASSIGN(out.index, agree_on_index(me, failure, st, comm, opt, out.stats));
  out.save_id = out.stats.save_id;
  out.stats.bytes_per_rank = out.index.bytes_of_rank;
  if (out.index.partial) {
    // Planned by key owners, each rank knows its own bytes only: 8 bytes from every rank.
    const std::uint64_t mine = out.index.bytes_of_rank.at(static_cast<std::size_t>(out.rank));
    const std::vector<bytes> all = comm.all_gather(encode_message(mine));
    for (std::size_t r = 0; r < all.size() && r < out.stats.bytes_per_rank.size(); ++r) {
      result<std::uint64_t> n = decode_message<std::uint64_t>(all[r], "planned bytes");
      if (!n) return std::move(n).err().with_rank(static_cast<int>(r));
      out.stats.bytes_per_rank[r] = *n;
    }
  }
  if (!out.index.common_holders.empty()) CAIRN_TRY(gather_held_commons(out, comm));
  list_items(leaves, pieces, out);
  return ok();
}

CAIRN_INLINE written_save write_phase(planned_save& plan,
                                      storage_ref st,
                                      const save_options& opt,
                                      buffer_pool* buffers) {
  written_save out;
  const save_strategy& strategy = strategy_of(opt);
  auto w =
      catch_all("writing the save", [&] { return strategy.write(plan, st, opt, buffers, out); });
  if (!w) out.failure = std::move(w).err().with_rank(plan.rank);
  if (out.failure) strategy.abandon(plan, out, st);
  return out;
}

CAIRN_INLINE result<std::vector<bytes>> assemble_step(planned_save& plan,
                                                      written_save& w,
                                                      const std::vector<bytes>& reports,
                                                      storage_ref st,
                                                      comm_ref comm,
                                                      const save_options& opt) {
  const save_strategy& strategy = strategy_of(opt);
  std::optional<error> failure;
  auto a = catch_all("assembling the save",
                     [&] { return strategy.assemble(plan, reports, st, opt, w); });
  if (!a) failure = std::move(a).err().with_rank(plan.rank);
  rank_statuses assembled = agree(comm, failure, w.assemble_report);
  if (auto f = assembled.first_failure()) {
    strategy.abandon(plan, w, st);
    return std::move(*f);
  }
  return std::move(assembled.payloads);
}

CAIRN_INLINE commit_outcome commit_on_root(planned_save& plan,
                                           written_save& w,
                                           const std::vector<bytes>& reports,
                                           const std::vector<bytes>& assembled,
                                           storage_ref st,
                                           const save_options& opt) {
  const save_strategy& strategy = strategy_of(opt);
  auto c = catch_all("committing the save",
                     [&] { return strategy.commit(plan, w, reports, assembled, st, opt); });
  if (c) {
    // Temporary objects of puts that never finished (killed processes): every put of this
    // save is done, so any left under the root are garbage.
    (void)st.remove_temporaries("");
    return {};
  }
  auto done = catch_all("reading the commit back", [&] { return strategy.committed(plan, w, st); });
  // Committed after all: files of a replaced checkpoint stay until the next save (the commit
  // may not be durable yet).
  if (done && *done) return {};
  if (done) return {std::move(c).err(), false};
  error e = std::move(c).err();
  e.message += "; whether the commit took effect is unknown (" + done.err().describe() +
               "), so nothing was removed: the next save cleans up";
  return {std::move(e), true};
}

CAIRN_INLINE void route_step(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt) {
  const save_strategy& strategy = strategy_of(opt);
  auto [failure, payload] = agree_at_root(comm, 0, w.failure, {}, [](const std::vector<bytes>&) {
    return std::pair{std::optional<error>{}, bytes{}};
  });
  if (failure) return;  // commit_at_root shares it
  std::vector<bytes> to(static_cast<std::size_t>(comm.size()));
  auto r = catch_all("routing the write reports", [&]() -> result<void> {
    to = strategy.route(plan, w, opt);
    if (to.size() != static_cast<std::size_t>(comm.size()))
      return make_error(errc::invalid_argument, "the strategy routed to the wrong number of ranks");
    return ok();
  });
  if (!r) {
    w.failure = std::move(r).err().with_rank(plan.rank);
    to.assign(static_cast<std::size_t>(comm.size()), bytes{});
  }
  std::vector<bytes> routed = comm.all_to_all(to);
  if (!w.failure) {
    auto a = catch_all("taking the routed reports",
                       [&] { return strategy.receive_routed(plan, routed, st, opt, w); });
    if (!a) w.failure = std::move(a).err().with_rank(plan.rank);
  }
  if (w.failure) strategy.abandon(plan, w, st);
}

CAIRN_INLINE result<void> commit_at_root(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt) {
  const save_strategy& strategy = strategy_of(opt);
  auto [failure, payload] =
      agree_at_root(comm, 0, w.failure, w.report, [&](const std::vector<bytes>& reports) {
        commit_outcome o = commit_on_root(plan, w, reports, {}, st, opt);
        return std::pair{std::move(o.failure), bytes{std::byte{o.unknown}}};
      });
  if (!failure) return ok();
  // A rank's write failed (this save's files are garbage; the previous checkpoint, if any, is
  // untouched because its metadata was not replaced), or the commit did: remove this rank's
  // files unless whether the commit took effect is unknown.
  if (!w.failure && (payload.empty() || payload[0] == std::byte{0})) strategy.abandon(plan, w, st);
  return std::move(*failure);
}

CAIRN_INLINE result<save_stats> commit_phase(
    planned_save& plan, written_save& w, storage_ref st, comm_ref comm, const save_options& opt) {
  const save_strategy& strategy = strategy_of(opt);
  const writer_features features = strategy.features(opt);
  if (!features.assembles) {
    if (features.routes) route_step(plan, w, st, comm, opt);
    CAIRN_TRY(commit_at_root(plan, w, st, comm, opt));
  } else {
    rank_statuses written = agree(comm, w.failure, w.report);
    if (auto f = written.first_failure()) {
      if (!w.failure) strategy.abandon(plan, w, st);
      return std::move(*f);
    }
    CAIRN_TRY_ASSIGN(std::vector<bytes> assembled,
                     assemble_step(plan, w, written.payloads, st, comm, opt));
    commit_outcome outcome;
    if (plan.rank == 0) outcome = commit_on_root(plan, w, written.payloads, assembled, st, opt);
    const std::byte unknown{outcome.unknown};
    auto [failure, payload] = announce(comm, 0, outcome.failure, std::span(&unknown, 1));
    if (failure) {
      if (payload.empty() || payload[0] == std::byte{0}) strategy.abandon(plan, w, st);
      return std::move(*failure);
    }
  }
  plan.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - plan.start).count();
  return plan.stats;
}

CAIRN_INLINE result<save_stats> save_leaves(const leaf_list& leaves,
                                            storage_ref st,
                                            comm_ref comm,
                                            const save_options& requested) {
  const save_options opt = effective_options(requested);
  // Tensors in device memory (none without a device): the writer reads them piece by piece
  // through a bounded staging window when it can, else they are first copied whole to pinned
  // host memory.
  leaf_list host_leaves = leaves;
  device_leaf_staging device(opt.staging);
  std::optional<error> staging_failure;
  cuda::staging_window* window = nullptr;
  if (strategy_of(opt).features(opt).reads_device_items) {
    auto w = device.open_window(host_leaves, opt.cuda_runtime, opt.staging_window, opt.block_size,
                                opt.io_threads);
    if (w)
      window = *w;
    else
      staging_failure = std::move(w).err().with_rank(comm.rank());
  } else if (auto r = device.to_host(host_leaves, opt.cuda_runtime); !r) {
    staging_failure = std::move(r).err().with_rank(comm.rank());
  }
  planned_save plan;
  recording_storage recorded(st);
  CAIRN_TRY(plan_phase(host_leaves, recorded, comm, opt, plan, staging_failure));
  plan.window = window;
  written_save w = write_phase(plan, recorded, opt);
  CAIRN_TRY_ASSIGN(save_stats stats, commit_phase(plan, w, recorded, comm, opt));
  stats.files = recorded.names();
  return stats;
}

}  // namespace cairn::detail
