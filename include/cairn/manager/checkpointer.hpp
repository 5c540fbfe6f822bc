// cairn/manager/checkpointer.hpp: the checkpoint manager a trainer constructs once and calls
// every N steps. Checkpoints live under one root (a directory, an S3 prefix, any storage), one
// per name from a template ("step{step:08}"); a pointer object `latest` names the newest, moved
// only after that checkpoint commits (also for async saves); named tags point at others;
// retention deletes old checkpoints only after a new one commits and never the one a pointer
// names; `load_latest` resumes from the pointer, or from the newest committed checkpoint when
// the pointer is missing or stale (one rank lists the root, every rank gets its answer).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "cairn/async/saver.hpp"
#include "cairn/comm/agree.hpp"
#include "cairn/comm/communicator.hpp"
#include "cairn/core/error.hpp"
#include "cairn/cuda/staging_pool.hpp"
#include "cairn/detail/binary.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/load.hpp"
#include "cairn/manager/names.hpp"
#include "cairn/manager/presets.hpp"
#include "cairn/options.hpp"
#include "cairn/plan/plan_cache.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/names.hpp"
#include "cairn/storage/open.hpp"
#include "cairn/storage/prefixed.hpp"

namespace cairn {

/// Options of a `checkpointer`.
struct checkpointer_options {
  /// The name of each checkpoint under the root (see `name_template`).
  std::string name = "step{step:08}";
  /// The pointer object under the root that names the newest committed checkpoint.
  std::string latest = "latest";
  /// Keep the newest `keep_last` checkpoints of this template (0: keep all). Older ones are
  /// deleted after a newer one commits, unless kept for another reason below.
  int keep_last = 0;
  /// Also keep every checkpoint whose step is a multiple of `keep_every` (0: none for this).
  std::int64_t keep_every = 0;
  /// Save in the background: `save` returns after staging; the checkpoint commits (and
  /// `latest` moves) at the next `save` or at `finalize`.
  bool async = false;
  /// Replace a committed checkpoint of the same name (OLMo-core's `save_overwrite`); without
  /// it such a save fails and the checkpoint stays.
  bool overwrite = false;
  /// Options of every save. The checkpointer sets `plan_cache` (its own, unless one is given),
  /// `staging` (likewise), `overwrite` and the counters in `content_metadata`.
  save_options save;
  /// Options of the async saver (`async`).
  async_saver_options async_options;
};

/// A checkpoint that committed, and what followed: `latest` (and the tags asked for) moved to
/// it, then retention ran.
struct committed_checkpoint {
  std::string name;                     ///< its name under the root
  save_stats stats;                     ///< of its save
  std::vector<std::string> deleted;     ///< the checkpoints retention deleted after it
  std::vector<error> retention_errors;  ///< deletions that failed (reported, never fatal)
};

/// What `checkpointer::save` did.
struct saved_checkpoint {
  std::string name;  ///< the checkpoint this call saved (or, async, started)
  /// What committed during this call: this checkpoint (synchronous), or the previous async one.
  std::optional<committed_checkpoint> committed;
  /// Async: the previous save failed at its commit; it is not loadable and `latest` did not
  /// move. This call's save was started all the same.
  std::optional<error> previous_failure;
};

/// What `checkpointer::load_latest` loaded.
struct loaded_checkpoint {
  std::string name;              ///< the checkpoint's name under the root
  checkpoint_counters counters;  ///< where training was when it was saved
  load_stats stats;              ///< of the load
  /// The pointer was missing or named something incomplete: the checkpoint was found by
  /// listing the root.
  bool found_by_scan = false;
};

/// A checkpoint found under a root (`list_checkpoints`).
struct checkpoint_entry {
  std::string name;       ///< its name under the root
  std::string format;     ///< "cairn", "torch_dist", "safetensors"; empty while incomplete
  bool complete = false;  ///< committed: its metadata is there
  /// The counters its name holds by the template (nullopt: not a name of this template).
  std::optional<checkpoint_counters> counters;
  bool latest = false;            ///< the `latest` pointer names it
  std::vector<std::string> tags;  ///< the tags that name it
  std::uint64_t bytes = 0;        ///< the size of its objects
  std::size_t objects = 0;        ///< how many objects it has
};

namespace detail {

/// The object whose presence commits a checkpoint of each format (deleted first, so that a
/// deletion cut short leaves an incomplete checkpoint, never a committed one with holes).
inline constexpr std::string_view commit_markers[] = {
    "metadata.json", ".metadata", "model.safetensors.index.json", "model.safetensors"};

/// The directory of tag pointers under a root.
inline constexpr std::string_view tags_prefix = "tags/";

/// The checkpoint names found in a listing of a root (first path components that have
/// objects below them), each with its objects' names relative to it.
inline std::map<std::string, std::vector<std::string>> group_by_checkpoint(
    const std::vector<std::string>& names) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& n : names) {
    const std::size_t slash = n.find('/');
    if (slash == std::string::npos) continue;
    std::string dir = n.substr(0, slash);
    if (dir + "/" == tags_prefix) continue;
    out[std::move(dir)].push_back(n.substr(slash + 1));
  }
  return out;
}

/// Whether `files` (of one checkpoint) hold a commit marker.
inline bool has_commit_marker(const std::vector<std::string>& files) {
  for (const auto& f : files)
    for (auto m : commit_markers)
      if (f == m) return true;
  return false;
}

/// The checkpoint name a pointer object holds (its text, trimmed), or nullopt when it is absent
/// or holds something that is not a checkpoint name.
inline result<std::optional<std::string>> read_pointer(storage_ref root, std::string_view ptr) {
  auto size = root.size(ptr);
  if (!size && size.err().code == errc::not_found) return std::optional<std::string>();
  if (!size) return size.err();
  if (*size > 4096) return std::optional<std::string>();  // not a pointer of ours
  std::string text(*size, '\0');
  CAIRN_TRY(root.read(ptr, 0, std::as_writable_bytes(std::span(text))));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r'))
    text.pop_back();
  if (text.empty() || text.find('/') != std::string::npos || !object_name_problem(text).empty())
    return std::optional<std::string>();
  return std::optional<std::string>(std::move(text));
}

/// Writes pointer `ptr` naming checkpoint `name` (atomically, on backends whose put is).
inline result<void> write_pointer(storage_ref root, std::string_view ptr, const std::string& name) {
  const std::string text = name + "\n";
  return root.put(ptr, std::as_bytes(std::span(text)));
}

/// Counters as content metadata ("cairn.step", ...), and back.
inline void put_counters(std::map<std::string, std::string>& m, const checkpoint_counters& c) {
  m["cairn.step"] = std::to_string(c.step);
  m["cairn.epoch"] = std::to_string(c.epoch);
  m["cairn.batch"] = std::to_string(c.batch);
  m["cairn.sample"] = std::to_string(c.sample);
  m["cairn.token"] = std::to_string(c.token);
  m["cairn.tag"] = c.tag;
}

inline std::optional<checkpoint_counters> get_counters(
    const std::map<std::string, std::string>& m) {
  checkpoint_counters c;
  auto number = [&](const char* key, std::int64_t& out) {
    auto it = m.find(key);
    if (it == m.end()) return false;
    auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), out);
    return ec == std::errc() && end == it->second.data() + it->second.size();
  };
  if (!number("cairn.step", c.step) || !number("cairn.epoch", c.epoch) ||
      !number("cairn.batch", c.batch) || !number("cairn.sample", c.sample) ||
      !number("cairn.token", c.token))
    return std::nullopt;
  if (auto it = m.find("cairn.tag"); it != m.end()) c.tag = it->second;
  return c;
}

inline void put_counters(binary_writer& w, const checkpoint_counters& c) {
  for (std::int64_t v : {c.step, c.epoch, c.batch, c.sample, c.token})
    w.u64(static_cast<std::uint64_t>(v));
  w.str(c.tag);
}

inline checkpoint_counters get_counters(binary_reader& r) {
  checkpoint_counters c;
  for (std::int64_t* v : {&c.step, &c.epoch, &c.batch, &c.sample, &c.token})
    *v = static_cast<std::int64_t>(r.u64());
  c.tag = r.str();
  return c;
}

/// Newest first: by step, then epoch, batch, sample, token, then name.
inline bool newer(const checkpoint_entry& a, const checkpoint_entry& b) {
  const auto& x = *a.counters;
  const auto& y = *b.counters;
  auto key = [](const checkpoint_counters& c) {
    return std::tuple(c.step, c.epoch, c.batch, c.sample, c.token);
  };
  if (key(x) != key(y)) return key(x) > key(y);
  return a.name > b.name;
}

}  // namespace detail

/// The checkpoints under `root`, by name (one `list` of the root, plus one small read per
/// pointer): complete or not, the counters their names hold by `names` (null: none parsed), and
/// which the pointer `latest` and the tags name. With `measure`, also each complete one's format
/// (its metadata read) and every object's size (a HEAD each on S3); without, `complete` says
/// only that a commit marker is there and `format` and `bytes` stay empty (what retention and
/// `load_latest` need, at one listing).
inline result<std::vector<checkpoint_entry>> list_checkpoints(storage_ref root,
                                                              const name_template* names,
                                                              std::string_view latest = "latest",
                                                              bool measure = true) {
  CAIRN_TRY_ASSIGN(auto all, root.list(""));
  std::optional<std::string> latest_name;
  if (!latest.empty()) {
    CAIRN_TRY_ASSIGN(latest_name, detail::read_pointer(root, latest));
  }
  std::map<std::string, std::vector<std::string>> tags;  // checkpoint -> tags naming it
  for (const auto& n : all) {
    if (!n.starts_with(detail::tags_prefix)) continue;
    CAIRN_TRY_ASSIGN(auto target, detail::read_pointer(root, n));
    if (target) tags[*target].push_back(n.substr(detail::tags_prefix.size()));
  }
  std::vector<checkpoint_entry> out;
  for (auto& [dir, files] : detail::group_by_checkpoint(all)) {
    checkpoint_entry e;
    e.name = dir;
    e.complete = detail::has_commit_marker(files);
    if (e.complete && measure) {
      CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(root, dir + "/"));
      CAIRN_TRY_ASSIGN(e.format, detect_format(sub));
      e.complete = !e.format.empty();
    }
    if (names) e.counters = names->match(dir);
    e.latest = latest_name && *latest_name == dir;
    if (auto it = tags.find(dir); it != tags.end()) e.tags = it->second;
    e.objects = files.size();
    for (const auto& f : files) {
      if (!measure) break;
      auto size = root.size(dir + "/" + f);
      if (size) e.bytes += *size;
    }
    out.push_back(std::move(e));
  }
  return out;
}

/// Deletes checkpoint `name` under `root`: its commit marker first (from then on it reads as
/// incomplete), then every other object, then what puts killed in it left (hidden temporaries
/// of file storage). Stops at the first failure. Nothing may be writing into it.
inline result<void> remove_checkpoint(storage_ref root, const std::string& name) {
  CAIRN_TRY_ASSIGN(auto files, root.list(name + "/"));
  std::vector<std::string> last;
  for (const auto& f : files) {
    const std::string_view rel = std::string_view(f).substr(name.size() + 1);
    bool marker = false;
    for (auto m : detail::commit_markers) marker = marker || rel == m;
    if (marker) {
      CAIRN_TRY(root.remove(f));
    } else {
      last.push_back(f);
    }
  }
  for (const auto& f : last) CAIRN_TRY(root.remove(f));
  CAIRN_TRY(root.remove_temporaries(name + "/"));
  return ok();
}

/// The checkpoint manager: one per rank, constructed once from a root storage and a
/// communicator and called every N steps. It owns the plan cache, the staging pool and the
/// async saver that a trainer would otherwise thread through by hand.
///
/// ```
/// cairn::file_storage root("/ckpt/run1");
/// cairn::checkpointer ckpt(root, comm, {.name = "step{step:08}", .keep_last = 3});
/// if (auto r = ckpt.load_latest(state).value()) start = r->counters.step;
/// for (std::int64_t step = start; step < steps; ++step) {
///   train_step();
///   if ((step + 1) % 100 == 0) ckpt.save(state, {.step = step + 1});
/// }
/// ckpt.finalize();
/// ```
///
/// Every member that takes a communicator step is collective: every rank calls it, in the same
/// order. The root storage and the communicator must outlive the checkpointer.
class checkpointer {
 public:
  /// A manager of the checkpoints under `root`. Throws cairn::exception (invalid_argument) when
  /// `opt` is not valid (a bad name template, a pointer name that is not a valid object name).
  checkpointer(storage_ref root, comm_ref comm, checkpointer_options opt = {})
      : checkpointer(nullptr, root, comm, std::move(opt)) {}

  /// A manager of the checkpoints under the storage `root_uri` names (a path, file://,
  /// memory://, s3:// with cairn/storage/s3.hpp included), which it opens and owns. Throws
  /// cairn::exception when the URI cannot be opened or `opt` is not valid.
  checkpointer(std::string_view root_uri, comm_ref comm, checkpointer_options opt = {})
      : checkpointer(open_shared(root_uri), comm, std::move(opt)) {}

  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;

  /// An async save never committed (no `finalize`) is dropped: it is not loadable and `latest`
  /// stays where it was.
  ~checkpointer() = default;

  /// Saves `tree` as the checkpoint the template names for `at` (collective). Every rank must
  /// name the same checkpoint and ask for the same `tags`: checked across ranks before anything
  /// is written (errc::invalid_argument naming the ranks that differ). Once the checkpoint
  /// commits, the `latest` pointer and the pointers `tags/<tag>` of `tags` name it, then
  /// retention runs. Async: a save still in flight is committed (and published) first; this
  /// one is started and commits at the next `save` or `finalize`.
  template <class Tree>
  result<saved_checkpoint> try_save(const Tree& tree,
                                    const checkpoint_counters& at,
                                    const std::vector<std::string>& tags = {}) {
    saved_checkpoint out;
    if (saver_ && pending_) {
      auto prev = finalize();
      if (!prev) {
        out.previous_failure = prev.err();
      } else {
        out.committed = std::move(*prev);
      }
    }
    CAIRN_TRY_ASSIGN(out.name, agree_on_name(at, tags));
    save_options so = opt_.save;
    detail::put_counters(so.content_metadata, at);
    auto sub = prefixed_storage::make(root_, out.name + "/");
    if (!sub) return sub.err();  // the same on every rank: the name was agreed
    if (saver_) {
      inflight_ = std::make_unique<prefixed_storage>(std::move(*sub));
      auto started = saver_->save(tree, *inflight_, comm_, so);
      if (!started) {
        inflight_.reset();
        return started.err();
      }
      pending_ = pending{out.name, tags};
      return out;
    }
    CAIRN_TRY_ASSIGN(save_stats stats, cairn::try_save(tree, *sub, comm_, so));
    CAIRN_TRY_ASSIGN(out.committed, publish(out.name, tags, std::move(stats)));
    return out;
  }

  /// `try_save` that throws cairn::exception on failure.
  template <class Tree>
  saved_checkpoint save(const Tree& tree,
                        const checkpoint_counters& at,
                        const std::vector<std::string>& tags = {}) {
    auto r = try_save(tree, at, tags);
    if (!r) throw exception(r.err());
    return std::move(*r);
  }

  /// Commits the async save in flight, if any, and publishes it (collective); returns it, or
  /// nullopt when none was in flight. Call it before the program ends: a save never committed
  /// is not loadable.
  result<std::optional<committed_checkpoint>> finalize() {
    if (!saver_ || !pending_) return std::optional<committed_checkpoint>();
    pending p = std::move(*pending_);
    pending_.reset();
    auto stats = saver_->finalize();
    inflight_.reset();
    if (!stats) return stats.err();
    CAIRN_TRY_ASSIGN(committed_checkpoint c, publish(p.name, p.tags, std::move(*stats)));
    return std::optional<committed_checkpoint>(std::move(c));
  }

  /// Whether an async save was started and not yet committed.
  bool in_flight() const noexcept { return pending_.has_value(); }

  /// The newest committed checkpoint (collective): the one the `latest` pointer names when it
  /// is committed, else the newest committed one whose name is of the template, found by one
  /// listing of the root on rank 0. Nullopt when there is none. Fails (errc::not_found) when
  /// the root holds committed checkpoints but none of the template's names, rather than start
  /// from scratch beside them.
  result<std::optional<std::pair<std::string, bool>>> find_latest() {
    CAIRN_TRY_ASSIGN(bytes got, decided_on_root([&]() -> result<bytes> {
                       CAIRN_TRY_ASSIGN(auto found, resolve_latest());
                       detail::binary_writer w;
                       if (found) {
                         w.str(found->first);
                         w.u8(found->second ? 1 : 0);
                       }
                       return std::move(w.data());
                     }));
    if (got.empty()) return std::optional<std::pair<std::string, bool>>();
    detail::binary_reader r(got);
    std::string name = r.str();
    const bool scanned = r.u8() != 0;
    return std::optional(std::pair(std::move(name), scanned));
  }

  /// Loads the newest committed checkpoint (`find_latest`) into `tree` (collective): which one
  /// and the counters it was saved at, or nullopt when the root holds none (a fresh start).
  template <class Tree>
  result<std::optional<loaded_checkpoint>> load_latest(Tree& tree, const load_options& opt = {}) {
    CAIRN_TRY_ASSIGN(auto found, find_latest());
    if (!found) return std::optional<loaded_checkpoint>();
    CAIRN_TRY_ASSIGN(loaded_checkpoint l, load(tree, found->first, opt));
    l.found_by_scan = found->second;
    return std::optional<loaded_checkpoint>(std::move(l));
  }

  /// Loads checkpoint `name` (or the one tag `name` points at, "tags/<name>") into `tree`
  /// (collective).
  template <class Tree>
  result<loaded_checkpoint> load(Tree& tree, std::string_view name, const load_options& opt = {}) {
    CAIRN_TRY_ASSIGN(bytes got, decided_on_root([&]() -> result<bytes> {
                       CAIRN_TRY_ASSIGN(auto found, resolve_name(std::string(name)));
                       detail::binary_writer w;
                       w.str(found.first);
                       detail::put_counters(w, found.second);
                       return std::move(w.data());
                     }));
    detail::binary_reader r(got);
    loaded_checkpoint out;
    out.name = r.str();
    out.counters = detail::get_counters(r);
    load_options lo = opt;
    if (lo.staging == nullptr && !in_flight()) lo.staging = opt_.save.staging;
    CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(root_, out.name + "/"));
    CAIRN_TRY_ASSIGN(out.stats, cairn::try_load(tree, sub, comm_, lo));
    return out;
  }

  /// The checkpoints under the root (`list_checkpoints` with this template and pointer). Not
  /// collective: call it on one rank of a large job.
  result<std::vector<checkpoint_entry>> list() const {
    return list_checkpoints(root_, &names_, opt_.latest);
  }

  /// The name template.
  const name_template& names() const noexcept { return names_; }
  /// The options, as completed by the constructor.
  const checkpointer_options& options() const noexcept { return opt_; }
  /// The storage of checkpoint `name` (its objects under "`name`/").
  result<prefixed_storage> storage_of(const std::string& name) const {
    return prefixed_storage::make(root_, name + "/");
  }

 private:
  checkpointer(std::shared_ptr<any_storage> owned, comm_ref comm, checkpointer_options opt)
      : checkpointer(owned, storage_ref(*owned), comm, std::move(opt)) {}

  checkpointer(std::shared_ptr<any_storage> owned,
               storage_ref root,
               comm_ref comm,
               checkpointer_options opt)
      : owned_(std::move(owned)),
        root_(root),
        comm_(comm),
        opt_(std::move(opt)),
        names_(parse_or_throw(opt_)) {
    if (opt_.save.plan_cache == nullptr) opt_.save.plan_cache = &cache_;
    if (opt_.save.staging == nullptr) {
      pool_ =
          std::make_unique<cuda::staging_pool>(opt_.async_options.pool, opt_.async_options.runtime);
      opt_.save.staging = pool_.get();
    }
    opt_.save.overwrite = opt_.overwrite;
    if (opt_.async) {
      async_saver_options a = opt_.async_options;
      if (a.staging == nullptr) a.staging = opt_.save.staging;
      a.in_flight = on_save_in_flight::wait;
      saver_ = std::make_unique<async_saver>(a);
    }
  }

  struct pending {
    std::string name;
    std::vector<std::string> tags;
  };

  static name_template parse_or_throw(const checkpointer_options& opt) {
    auto t = name_template::parse(opt.name);
    if (!t) throw exception(t.err());
    if (auto why = object_name_problem(opt.latest);
        !why.empty() || opt.latest.find('/') != std::string::npos)
      throw exception(
          make_error(errc::invalid_argument,
                     "the latest pointer \"" + opt.latest + "\" must be one valid path component"));
    if (opt.keep_last < 0 || opt.keep_every < 0)
      throw exception(make_error(errc::invalid_argument, "keep_last and keep_every must be >= 0"));
    return std::move(*t);
  }

  static std::shared_ptr<any_storage> open_shared(std::string_view uri) {
    auto st = open_storage(uri);
    if (!st) throw exception(st.err());
    return std::make_shared<any_storage>(std::move(*st));
  }

  /// Collective: `decide()` runs on rank 0 alone (storage reads and writes only, no collective);
  /// every rank receives its bytes, or its error.
  template <class Decide>
  result<bytes> decided_on_root(Decide&& decide) {
    std::optional<error> failure;
    bytes payload;
    if (comm_.rank() == 0) {
      result<bytes> r = decide();
      if (r) {
        payload = std::move(*r);
      } else {
        failure = r.err();
      }
    }
    auto [status, got] = announce(comm_, 0, failure, payload);
    if (status) return *status;
    return std::move(got);
  }

  /// Collective: the name of the checkpoint at `at`, the same on every rank with the same
  /// tags, or an error naming the ranks that differ (or whose name is not valid).
  result<std::string> agree_on_name(const checkpoint_counters& at,
                                    const std::vector<std::string>& tags) {
    std::optional<error> mine;
    std::string name;
    if (auto n = names_.format(at, comm_.size())) {
      name = std::move(*n);
    } else {
      mine = n.err();
    }
    for (const auto& t : tags)
      if (t.empty() || t.find('/') != std::string::npos || !object_name_problem(t).empty())
        mine = make_error(errc::invalid_argument, "tag \"" + t + "\" is not one path component");
    detail::binary_writer w;
    w.str(name);
    w.u64(tags.size());
    for (const auto& t : tags) w.str(t);
    auto [status, agreed] =
        agree_at_root(comm_, 0, mine, w.data(), [&](const std::vector<bytes>& all) {
          std::map<bytes, std::vector<int>> by;
          for (std::size_t r = 0; r < all.size(); ++r) by[all[r]].push_back(static_cast<int>(r));
          if (by.size() == 1) return std::pair(std::optional<error>(), bytes());
          std::string msg = "the ranks name different checkpoints (or tags):";
          for (const auto& [b, ranks] : by) {
            detail::binary_reader r(b);
            msg += " rank" + std::string(ranks.size() > 1 ? "s " : " ");
            for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
              msg += (i ? "," : "") + std::to_string(ranks[i]);
            if (ranks.size() > 8) msg += ",...";
            msg += " \"" + r.str() + "\";";
          }
          msg.pop_back();
          return std::pair(std::optional(make_error(errc::invalid_argument, msg)), bytes());
        });
    if (status) return *status;
    return name;
  }

  /// Collective, after `name` committed: rank 0 moves `latest` and the tags to it, then runs
  /// retention; every rank learns how that went. A pointer that could not be moved is an error
  /// (the checkpoint is committed, but `latest` still names an older one); failed deletions are
  /// reported in the result.
  result<committed_checkpoint> publish(const std::string& name,
                                       const std::vector<std::string>& tags,
                                       save_stats stats) {
    CAIRN_TRY_ASSIGN(bytes got, decided_on_root([&]() -> result<bytes> {
                       CAIRN_TRY_ASSIGN(committed_checkpoint done, catch_and_publish(name, tags));
                       detail::binary_writer w;
                       w.u64(done.deleted.size());
                       for (const auto& d : done.deleted) w.str(d);
                       w.u64(done.retention_errors.size());
                       for (const auto& e : done.retention_errors) detail::put_error(w, e);
                       return std::move(w.data());
                     }));
    committed_checkpoint c;
    c.name = name;
    c.stats = std::move(stats);
    detail::binary_reader r(got);
    for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) c.deleted.push_back(r.str());
    for (std::uint64_t i = 0, n = r.u64(); i < n; ++i)
      if (auto e = detail::get_error(r)) c.retention_errors.push_back(std::move(*e));
    return c;
  }

  result<committed_checkpoint> catch_and_publish(const std::string& name,
                                                 const std::vector<std::string>& tags) {
    return detail::catch_all("publishing the checkpoint", [&]() -> result<committed_checkpoint> {
      committed_checkpoint c;
      auto moved = [&](const std::string& ptr) -> result<void> {
        auto w = detail::write_pointer(root_, ptr, name);
        if (w) return ok();
        error e = w.err();
        e.message = "checkpoint \"" + name + "\" is committed, but pointer \"" + ptr +
                    "\" could not be moved to it: " + e.message;
        return e;
      };
      CAIRN_TRY(moved(opt_.latest));
      for (const auto& t : tags) CAIRN_TRY(moved(std::string(detail::tags_prefix) + t));
      // What killed puts of the pointers left (no put of this checkpointer is in flight now).
      (void)root_.remove_temporaries(opt_.latest);
      if (!tags.empty()) (void)root_.remove_temporaries(detail::tags_prefix);
      retain(name, c);
      return c;
    });
  }

  /// Rank 0, after `name` committed and `latest` names it: deletes the committed checkpoints
  /// of this template that no rule keeps, and the incomplete ones older than `name` (left by
  /// killed or failed saves). Never `name`, never one a pointer names, never an incomplete one
  /// newer than `name` (an async save in flight), never one whose name is not of the template.
  void retain(const std::string& name, committed_checkpoint& c) {
    if (opt_.keep_last == 0) return;
    auto found = list_checkpoints(root_, &names_, opt_.latest, /*measure=*/false);
    if (!found) {
      c.retention_errors.push_back(found.err());
      return;
    }
    std::vector<checkpoint_entry> ours, unfinished;
    for (auto& e : *found) {
      if (!e.counters) continue;
      (e.complete ? ours : unfinished).push_back(std::move(e));
    }
    std::sort(ours.begin(), ours.end(), detail::newer);
    // Incomplete checkpoints older than the one just committed are what killed or failed saves
    // left (this job's saves in flight are all newer): they go too.
    auto just = std::find_if(ours.begin(), ours.end(),
                             [&](const checkpoint_entry& e) { return e.name == name; });
    for (const auto& e : unfinished) {
      if (just == ours.end() || !detail::newer(*just, e)) continue;
      if (auto r = remove_checkpoint(root_, e.name); !r) {
        c.retention_errors.push_back(r.err());
      } else {
        c.deleted.push_back(e.name);
      }
    }
    for (std::size_t i = 0; i < ours.size(); ++i) {
      const checkpoint_entry& e = ours[i];
      const bool keep = i < static_cast<std::size_t>(opt_.keep_last) || e.name == name ||
                        e.latest || !e.tags.empty() ||
                        (opt_.keep_every > 0 && e.counters->step % opt_.keep_every == 0);
      if (keep) continue;
      if (auto r = remove_checkpoint(root_, e.name); !r) {
        c.retention_errors.push_back(r.err());
      } else {
        c.deleted.push_back(e.name);
      }
    }
  }

  /// Rank 0: the newest committed checkpoint and whether it was found by listing.
  result<std::optional<std::pair<std::string, bool>>> resolve_latest() {
    return detail::catch_all(
        "finding the latest checkpoint",
        [&]() -> result<std::optional<std::pair<std::string, bool>>> {
          CAIRN_TRY_ASSIGN(auto ptr, detail::read_pointer(root_, opt_.latest));
          if (ptr) {
            CAIRN_TRY_ASSIGN(std::string format, format_at(*ptr));
            if (!format.empty()) return std::optional(std::pair(*ptr, false));
          }
          CAIRN_TRY_ASSIGN(auto found,
                           list_checkpoints(root_, &names_, opt_.latest, /*measure=*/false));
          std::vector<checkpoint_entry> ours;
          std::vector<std::string> others;
          for (auto& e : found) {
            if (!e.complete) continue;
            if (e.counters) {
              ours.push_back(std::move(e));
            } else {
              others.push_back(e.name);
            }
          }
          if (ours.empty() && !others.empty()) {
            std::string list;
            for (std::size_t i = 0; i < others.size() && i < 5; ++i)
              list += (i ? ", " : "") + others[i];
            return make_error(errc::not_found, "no committed checkpoint named like \"" +
                                                   names_.text() + "\", but others are there (" +
                                                   list +
                                                   "): load one by name, or use their template")
                .with_file(root_.describe(""));
          }
          std::sort(ours.begin(), ours.end(), detail::newer);
          for (const auto& e :
               ours) {  // newest first; a marker that is not a checkpoint's is passed
            CAIRN_TRY_ASSIGN(std::string format, format_at(e.name));
            if (!format.empty()) return std::optional(std::pair(e.name, true));
          }
          return std::optional<std::pair<std::string, bool>>();
        });
  }

  /// Rank 0: the format of checkpoint `name` under the root ("" when it is not committed).
  result<std::string> format_at(const std::string& name) {
    CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(root_, name + "/"));
    return detect_format(sub);
  }

  /// Rank 0: checkpoint `name` (or the one tag `name` names) and its counters; errc::not_found
  /// when it is not committed.
  result<std::pair<std::string, checkpoint_counters>> resolve_name(std::string name) {
    return detail::catch_all(
        "finding the checkpoint", [&]() -> result<std::pair<std::string, checkpoint_counters>> {
          CAIRN_TRY_ASSIGN(std::string format, format_at(name));
          if (format.empty()) {
            CAIRN_TRY_ASSIGN(auto tagged,
                             detail::read_pointer(root_, std::string(detail::tags_prefix) + name));
            if (tagged) {
              name = *tagged;
              CAIRN_TRY_ASSIGN(format, format_at(name));
            }
          }
          if (format.empty())
            return make_error(errc::not_found,
                              "no committed checkpoint (or tag) \"" + name + "\" here")
                .with_file(root_.describe(name));
          std::optional<checkpoint_counters> c;
          if (format == "cairn") {
            CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(root_, name + "/"));
            CAIRN_TRY_ASSIGN(auto meta, read_content_metadata(sub));
            c = detail::get_counters(meta);
          }
          if (!c) c = names_.match(name);
          return std::pair(name, c.value_or(checkpoint_counters{}));
        });
  }

  std::shared_ptr<any_storage> owned_;  ///< the root, when opened from a URI
  storage_ref root_;
  comm_ref comm_;
  checkpointer_options opt_;
  name_template names_;
  save_plan_cache cache_;
  std::unique_ptr<cuda::staging_pool> pool_;
  /// The storage of the async save in flight (declared before the saver: the saver's
  /// destructor waits for its background writes into it).
  std::unique_ptr<prefixed_storage> inflight_;
  std::unique_ptr<async_saver> saver_;
  std::optional<pending> pending_;
};

}  // namespace cairn
