// cairn/manager/checkpointer-inl.hpp: the bodies of cairn/manager/checkpointer.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <charconv>
#include <set>
#include <tuple>

#include "cairn/comm/agree.hpp"
#include "cairn/cuda/staging_pool.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/load.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "cairn/manager/presets.hpp"
#include "cairn/pipeline/load_cache.hpp"
#include "cairn/plan/plan_cache.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/any_storage.hpp"
#include "cairn/storage/names.hpp"
#include "cairn/storage/open.hpp"

namespace cairn::detail {

CAIRN_INLINE std::map<std::string, std::vector<std::string>> group_by_checkpoint(
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

CAIRN_INLINE bool has_commit_marker(const std::vector<std::string>& files) {
  for (const auto& f : files)
    if (is_commit_marker(f)) return true;
  return false;
}

CAIRN_INLINE void put_counters(std::map<std::string, std::string>& m,
                               const checkpoint_counters& c) {
  m["cairn.step"] = std::to_string(c.step);
  m["cairn.epoch"] = std::to_string(c.epoch);
  m["cairn.batch"] = std::to_string(c.batch);
  m["cairn.sample"] = std::to_string(c.sample);
  m["cairn.token"] = std::to_string(c.token);
  m["cairn.tag"] = c.tag;
}

CAIRN_INLINE std::optional<checkpoint_counters> get_counters(
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

CAIRN_INLINE bool newer(const checkpoint_entry& a, const checkpoint_entry& b) {
  const auto& x = *a.counters;
  const auto& y = *b.counters;
  auto key = [](const checkpoint_counters& c) {
    return std::tuple(c.step, c.epoch, c.batch, c.sample, c.token);
  };
  if (key(x) != key(y)) return key(x) > key(y);
  return a.name > b.name;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<std::vector<checkpoint_entry>> list_checkpoints(storage_ref root,
                                                                    const name_template* names,
                                                                    std::string_view latest,
                                                                    bool measure) {
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

CAIRN_INLINE result<void> remove_checkpoint(storage_ref root, const std::string& name) {
  CAIRN_TRY_ASSIGN(auto files, root.list(name + "/"));
  std::vector<std::string> last;
  for (const auto& f : files) {
    const std::string_view rel = std::string_view(f).substr(name.size() + 1);
    if (is_commit_marker(rel)) {
      CAIRN_TRY(root.remove(f));
    } else {
      last.push_back(f);
    }
  }
  for (const auto& f : last) CAIRN_TRY(root.remove(f));
  CAIRN_TRY(root.remove_temporaries(name + "/"));
  return ok();
}

struct checkpointer::state {
  /// How publishing a committed async save went (set by the thread that committed it).
  using publish_slot = std::shared_ptr<std::optional<result<committed_checkpoint>>>;
  struct pending {
    std::string name;
    std::vector<std::string> tags;
    save_handle handle;  ///< of the async save
    publish_slot published;
  };

  state(std::shared_ptr<any_storage> owned,
        storage_ref root,
        comm_ref comm,
        checkpointer_options opt)
      : owned_(std::move(owned)),
        root_(root),
        comm_(comm),
        opt_(std::move(opt)),
        names_(parse_or_throw(opt_)) {}

  std::shared_ptr<any_storage> owned_;  ///< the root, when opened from a URI
  storage_ref root_;
  comm_ref comm_;
  checkpointer_options opt_;
  name_template names_;
  save_plan_cache cache_;
  load_plan_cache load_cache_;  ///< index chunks of the last load, for loading it again
  std::unique_ptr<cuda::staging_pool> pool_;
  /// The storage of the async save in flight (declared before the saver: the saver's
  /// destructor waits for its background writes into it).
  std::unique_ptr<prefixed_storage> inflight_;
  std::unique_ptr<async_saver> saver_;
  std::optional<pending> pending_;
};

CAIRN_INLINE checkpointer::checkpointer(storage_ref root, comm_ref comm, checkpointer_options opt)
    : checkpointer(nullptr, root, comm, std::move(opt)) {}

CAIRN_INLINE checkpointer::checkpointer(std::string_view root_uri,
                                        comm_ref comm,
                                        checkpointer_options opt)
    : checkpointer(open_shared(root_uri), comm, std::move(opt)) {}

CAIRN_INLINE checkpointer::checkpointer(std::shared_ptr<any_storage> owned,
                                        comm_ref comm,
                                        checkpointer_options opt)
    : checkpointer(owned, storage_ref(*owned), comm, std::move(opt)) {}

CAIRN_INLINE checkpointer::checkpointer(std::shared_ptr<any_storage> owned,
                                        storage_ref root,
                                        comm_ref comm,
                                        checkpointer_options opt)
    : s_(std::make_unique<state>(std::move(owned), root, comm, std::move(opt))) {
  state& s = *s_;
  if (s.opt_.save.plan_cache == nullptr) s.opt_.save.plan_cache = &s.cache_;
  if (s.opt_.save.staging == nullptr) {
    s.pool_ = std::make_unique<cuda::staging_pool>(s.opt_.async_options.pool,
                                                   s.opt_.async_options.runtime);
    s.opt_.save.staging = s.pool_.get();
  }
  s.opt_.save.overwrite = s.opt_.overwrite;
  if (s.opt_.async) {
    async_saver_options a = s.opt_.async_options;
    if (a.staging == nullptr) a.staging = s.opt_.save.staging;
    a.in_flight = on_save_in_flight::wait;
    s.saver_ = std::make_unique<async_saver>(a);
  }
}

CAIRN_INLINE checkpointer::~checkpointer() {
  // First: the saver's background thread may still be publishing, which reads this state.
  if (s_) s_->saver_.reset();
}

template <class Decide>
result<bytes> checkpointer::decided_on_root(comm_ref comm, Decide&& decide) {
  std::optional<error> failure;
  bytes payload;
  if (comm.rank() == 0) {
    result<bytes> r = decide();
    if (r) {
      payload = std::move(*r);
    } else {
      failure = r.err();
    }
  }
  auto [status, got] = announce(comm, 0, failure, payload);
  if (status) return *status;
  return std::move(got);
}

CAIRN_INLINE result<saved_checkpoint> checkpointer::save_flattened(
    const flatten_fn& leaves, const checkpoint_counters& at, const std::vector<std::string>& tags) {
  state& s = *s_;
  saved_checkpoint out;
  if (s.saver_ && s.pending_) {
    auto prev = finalize();
    if (!prev) {
      out.previous_failure = prev.err();
    } else {
      out.committed = std::move(*prev);
    }
  }
  CAIRN_TRY_ASSIGN(out.name, agree_on_name(at, tags));
  save_options so = s.opt_.save;
  detail::put_counters(so.content_metadata, at);
  auto sub = prefixed_storage::make(s.root_, out.name + "/");
  if (!sub) return sub.err();  // the same on every rank: the name was agreed
  if (s.saver_) {
    s.inflight_ = std::make_unique<prefixed_storage>(std::move(*sub));
    // Published by whichever thread commits: the background one, or this one at `finalize`.
    auto published = std::make_shared<state::publish_slot::element_type>();
    auto publish_after = [this, name = out.name, tags, published](const save_stats& stats,
                                                                  comm_ref on) {
      *published = publish(name, tags, stats, on);
    };
    // async_saver::save, for leaves already visited.
    result<save_handle> started = [&]() -> result<save_handle> {
      try {
        return s.saver_->save_leaves(leaves(), *s.inflight_, s.comm_, so, publish_after);
      } catch (...) {
        return detail::current_exception_error("starting an async save").with_rank(s.comm_.rank());
      }
    }();
    if (!started) {
      s.inflight_.reset();
      return started.err();
    }
    s.pending_ = state::pending{out.name, tags, *started, std::move(published)};
    return out;
  }
  // cairn::try_save, for leaves already visited.
  result<save_stats> stats = [&]() -> result<save_stats> {
    try {
      return detail::save_leaves(leaves(), *sub, s.comm_, so);
    } catch (...) {
      return detail::current_exception_error("saving").with_rank(s.comm_.rank());
    }
  }();
  if (!stats) return stats.err();
  CAIRN_TRY_ASSIGN(out.committed, publish(out.name, tags, std::move(*stats), s.comm_));
  return out;
}

CAIRN_INLINE result<loaded_checkpoint> checkpointer::load_flattened(const flatten_fn& leaves,
                                                                    std::string_view name,
                                                                    const load_options& opt) {
  CAIRN_TRY_ASSIGN(bytes got, decided_on_root(s_->comm_, [&]() -> result<bytes> {
                     CAIRN_TRY_ASSIGN(auto found, resolve_name(std::string(name)));
                     return detail::encode_message(
                         detail::resolved_message{std::move(found.first), found.second});
                   }));
  CAIRN_TRY_ASSIGN(detail::resolved_message resolved,
                   detail::decode_message<detail::resolved_message>(got));
  loaded_checkpoint out;
  out.name = std::move(resolved.name);
  out.counters = std::move(resolved.counters);
  load_options lo = opt;
  if (lo.staging == nullptr && !in_flight()) lo.staging = s_->opt_.save.staging;
  if (lo.plan_cache == nullptr) lo.plan_cache = &s_->load_cache_;
  CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(s_->root_, out.name + "/"));
  // cairn::try_load, for leaves visited here.
  result<load_stats> stats = [&]() -> result<load_stats> {
    try {
      return detail::load_leaves(leaves(), sub, s_->comm_, lo);
    } catch (...) {
      return detail::current_exception_error("loading").with_rank(s_->comm_.rank());
    }
  }();
  if (!stats) return stats.err();
  out.stats = std::move(*stats);
  return out;
}

CAIRN_INLINE bool checkpointer::in_flight() const noexcept { return s_->pending_.has_value(); }

CAIRN_INLINE bool checkpointer::written() const noexcept {
  return s_->pending_ && s_->pending_->handle.written();
}

CAIRN_INLINE bool checkpointer::done() const noexcept {
  return s_->pending_ && s_->pending_->handle.done();
}

CAIRN_INLINE result<std::vector<checkpoint_entry>> checkpointer::list() const {
  return list_checkpoints(s_->root_, &s_->names_, s_->opt_.latest);
}

CAIRN_INLINE const name_template& checkpointer::names() const noexcept { return s_->names_; }

CAIRN_INLINE const checkpointer_options& checkpointer::options() const noexcept { return s_->opt_; }

CAIRN_INLINE result<prefixed_storage> checkpointer::storage_of(const std::string& name) const {
  return prefixed_storage::make(s_->root_, name + "/");
}

CAIRN_INLINE result<std::optional<committed_checkpoint>> checkpointer::finalize() {
  if (!s_->saver_ || !s_->pending_) return std::optional<committed_checkpoint>();
  state::pending p = std::move(*s_->pending_);
  s_->pending_.reset();
  auto stats = s_->saver_->finalize();
  s_->inflight_.reset();
  if (!stats) return stats.err();
  // Committed: the thread that committed published it too (commit_flight runs publish_after).
  CAIRN_TRY_ASSIGN(committed_checkpoint c, std::move(**p.published));
  return std::optional<committed_checkpoint>(std::move(c));
}

CAIRN_INLINE result<std::optional<std::pair<std::string, bool>>> checkpointer::find_latest() {
  CAIRN_TRY_ASSIGN(bytes got, decided_on_root(s_->comm_, [&]() -> result<bytes> {
                     CAIRN_TRY_ASSIGN(auto found, resolve_latest());
                     return detail::encode_message(detail::latest_message(std::move(found)));
                   }));
  return detail::decode_message<detail::latest_message>(got, "latest checkpoint");
}

CAIRN_INLINE name_template checkpointer::parse_or_throw(const checkpointer_options& opt) {
  auto t = name_template::parse(opt.name);
  if (!t) throw exception(t.err());
  if (auto why = object_name_problem(opt.latest);
      !why.empty() || opt.latest.find('/') != std::string::npos)
    throw exception(make_error(errc::invalid_argument, "the latest pointer \"" + opt.latest +
                                                           "\" must be one valid path component"));
  if (opt.keep_last < 0 || opt.keep_every < 0)
    throw exception(make_error(errc::invalid_argument, "keep_last and keep_every must be >= 0"));
  return std::move(*t);
}

CAIRN_INLINE std::shared_ptr<any_storage> checkpointer::open_shared(std::string_view uri) {
  auto st = open_storage(uri);
  if (!st) throw exception(st.err());
  return std::make_shared<any_storage>(std::move(*st));
}

CAIRN_INLINE result<std::string> checkpointer::agree_on_name(const checkpoint_counters& at,
                                                             const std::vector<std::string>& tags) {
  std::optional<error> mine;
  std::string name;
  if (auto n = s_->names_.format(at, s_->comm_.size())) {
    name = std::move(*n);
  } else {
    mine = n.err();
  }
  for (const auto& t : tags)
    if (t.empty() || t.find('/') != std::string::npos || !object_name_problem(t).empty())
      mine = make_error(errc::invalid_argument, "tag \"" + t + "\" is not one path component");
  const bytes proposed = detail::encode_message(detail::proposed_name_message{name, tags});
  auto [status, agreed] =
      agree_at_root(s_->comm_, 0, mine, proposed, [&](const std::vector<bytes>& all) {
        std::map<bytes, std::vector<int>> by;
        for (std::size_t r = 0; r < all.size(); ++r) by[all[r]].push_back(static_cast<int>(r));
        if (by.size() == 1) return std::pair(std::optional<error>(), bytes());
        std::string msg = "the ranks name different checkpoints (or tags):";
        for (const auto& [b, ranks] : by) {
          auto said = detail::decode_message<detail::proposed_name_message>(b);
          msg += " rank" + std::string(ranks.size() > 1 ? "s " : " ");
          for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
            msg += (i ? "," : "") + std::to_string(ranks[i]);
          if (ranks.size() > 8) msg += ",...";
          msg += " \"" + (said ? said->name : said.err().message) + "\";";
        }
        msg.pop_back();
        return std::pair(std::optional(make_error(errc::invalid_argument, msg)), bytes());
      });
  if (status) return *status;
  return name;
}

CAIRN_INLINE result<committed_checkpoint> checkpointer::publish(
    const std::string& name,
    const std::vector<std::string>& tags,
    save_stats stats,
    comm_ref comm) {
  CAIRN_TRY_ASSIGN(bytes got, decided_on_root(comm, [&]() -> result<bytes> {
                     CAIRN_TRY_ASSIGN(committed_checkpoint done, catch_and_publish(name, tags));
                     return detail::encode_message(detail::published_message{
                         std::move(done.deleted), std::move(done.retention_errors)});
                   }));
  CAIRN_TRY_ASSIGN(detail::published_message published,
                   detail::decode_message<detail::published_message>(got));
  committed_checkpoint c;
  c.name = name;
  c.stats = std::move(stats);
  c.deleted = std::move(published.deleted);
  c.retention_errors = std::move(published.retention_errors);
  return c;
}

CAIRN_INLINE result<committed_checkpoint> checkpointer::catch_and_publish(
    const std::string& name, const std::vector<std::string>& tags) {
  return detail::catch_all("publishing the checkpoint", [&]() -> result<committed_checkpoint> {
    committed_checkpoint c;
    auto moved = [&](const std::string& ptr) -> result<void> {
      auto w = detail::write_pointer(s_->root_, ptr, name);
      if (w) return ok();
      error e = w.err();
      e.message = "checkpoint \"" + name + "\" is committed, but pointer \"" + ptr +
                  "\" could not be moved to it: " + e.message;
      return e;
    };
    CAIRN_TRY(moved(s_->opt_.latest));
    for (const auto& t : tags) CAIRN_TRY(moved(std::string(detail::tags_prefix) + t));
    // What killed puts of the pointers left (no put of this checkpointer is in flight now).
    (void)s_->root_.remove_temporaries(s_->opt_.latest);
    if (!tags.empty()) (void)s_->root_.remove_temporaries(detail::tags_prefix);
    retain(name, c);
    return c;
  });
}

CAIRN_INLINE void checkpointer::retain(const std::string& name, committed_checkpoint& c) {
  if (s_->opt_.keep_last == 0) return;
  auto found = list_checkpoints(s_->root_, &s_->names_, s_->opt_.latest, /*measure=*/false);
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
    if (auto r = remove_checkpoint(s_->root_, e.name); !r) {
      c.retention_errors.push_back(r.err());
    } else {
      c.deleted.push_back(e.name);
    }
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const checkpoint_entry& e = ours[i];
    const bool keep = i < static_cast<std::size_t>(s_->opt_.keep_last) || e.name == name ||
                      e.latest || !e.tags.empty() ||
                      (s_->opt_.keep_every > 0 && e.counters->step % s_->opt_.keep_every == 0);
    if (keep) continue;
    if (auto r = remove_checkpoint(s_->root_, e.name); !r) {
      c.retention_errors.push_back(r.err());
    } else {
      c.deleted.push_back(e.name);
    }
  }
}

CAIRN_INLINE result<std::optional<std::pair<std::string, bool>>> checkpointer::resolve_latest() {
  return detail::catch_all(
      "finding the latest checkpoint",
      [&]() -> result<std::optional<std::pair<std::string, bool>>> {
        CAIRN_TRY_ASSIGN(auto ptr, detail::read_pointer(s_->root_, s_->opt_.latest));
        if (ptr) {
          CAIRN_TRY_ASSIGN(std::string format, format_at(*ptr));
          if (!format.empty()) return std::optional(std::pair(*ptr, false));
        }
        CAIRN_TRY_ASSIGN(auto found, list_checkpoints(s_->root_, &s_->names_, s_->opt_.latest,
                                                      /*measure=*/false));
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
                                                 s_->names_.text() + "\", but others are there (" +
                                                 list +
                                                 "): load one by name, or use their template")
              .with_file(s_->root_.describe(""));
        }
        std::sort(ours.begin(), ours.end(), detail::newer);
        for (const auto& e : ours) {  // newest first; a marker that is not a checkpoint's is passed
          CAIRN_TRY_ASSIGN(std::string format, format_at(e.name));
          if (!format.empty()) return std::optional(std::pair(e.name, true));
        }
        return std::optional<std::pair<std::string, bool>>();
      });
}

CAIRN_INLINE result<std::string> checkpointer::format_at(const std::string& name) {
  CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(s_->root_, name + "/"));
  return detect_format(sub);
}

CAIRN_INLINE result<std::pair<std::string, checkpoint_counters>> checkpointer::resolve_name(
    std::string name) {
  return detail::catch_all(
      "finding the checkpoint", [&]() -> result<std::pair<std::string, checkpoint_counters>> {
        CAIRN_TRY_ASSIGN(std::string format, format_at(name));
        if (format.empty()) {
          CAIRN_TRY_ASSIGN(auto tagged, detail::read_pointer(
                                            s_->root_, std::string(detail::tags_prefix) + name));
          if (tagged) {
            name = *tagged;
            CAIRN_TRY_ASSIGN(format, format_at(name));
          }
        }
        if (format.empty())
          return make_error(errc::not_found,
                            "no committed checkpoint (or tag) \"" + name + "\" here")
              .with_file(s_->root_.describe(name));
        CAIRN_TRY_ASSIGN(auto sub, prefixed_storage::make(s_->root_, name + "/"));
        CAIRN_TRY_ASSIGN(auto meta, read_content_metadata(sub));
        std::optional<checkpoint_counters> c = detail::get_counters(meta);
        if (!c) c = s_->names_.match(name);
        return std::pair(name, c.value_or(checkpoint_counters{}));
      });
}

}  // namespace cairn
