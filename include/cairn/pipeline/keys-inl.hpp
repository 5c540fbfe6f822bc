// cairn/pipeline/keys-inl.hpp: the bodies of cairn/pipeline/keys.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <cstdio>

#include "cairn/pipeline/keys.hpp"

namespace cairn::detail {

CAIRN_INLINE leaf_list select_leaves(const leaf_list& leaves, const load_options& opt) {
  std::vector<std::string> keys;
  auto ignored = [&](const std::string& k) {
    for (const auto& g : opt.ignore_keys)
      if (::fnmatch(g.c_str(), k.c_str(), 0) == 0) return true;
    return false;
  };
  auto collect = [&](const auto& list) {
    for (const auto& l : list)
      if (!ignored(tree_key(l))) keys.push_back(tree_key(l));
  };
  collect(leaves.tensors);
  collect(leaves.objects);
  collect(leaves.commons);
  if (opt.edit_keys) opt.edit_keys(keys);
  std::set<std::string> keep(keys.begin(), keys.end());
  auto mapped = [&](const std::string& k) {
    auto it = opt.key_mapping.find(k);
    return it == opt.key_mapping.end() ? k : it->second;
  };
  leaf_list out;
  out.keep_alive = leaves.keep_alive;
  out.after_load = leaves.after_load;
  for (auto t : leaves.tensors)
    if (keep.count(t.sharding.key)) {
      t.sharding.key = mapped(t.sharding.key);
      out.tensors.push_back(std::move(t));
    }
  for (auto o : leaves.objects)
    if (keep.count(o.key)) {
      o.key = mapped(o.key);
      out.objects.push_back(std::move(o));
    }
  for (auto c : leaves.commons)
    if (keep.count(c.path)) {
      c.path = mapped(c.path);
      out.commons.push_back(std::move(c));
    }
  return out;
}

CAIRN_INLINE std::set<std::string> drop_unexpected(leaf_list& leaves,
                                                   const std::set<std::string>& saved,
                                                   load_stats& stats) {
  std::set<std::string> requested, unexpected;
  auto drop = [&](auto& list) {
    for (const auto& l : list) requested.insert(tree_key(l));
    std::erase_if(list, [&](const auto& l) {
      if (saved.count(tree_key(l))) return false;
      unexpected.insert(tree_key(l));
      return true;
    });
  };
  drop(leaves.tensors);
  drop(leaves.objects);
  drop(leaves.commons);
  stats.unexpected.assign(unexpected.begin(), unexpected.end());
  return requested;
}

CAIRN_INLINE result<void> report_strict(const load_options& opt,
                                        int rank,
                                        const load_stats& stats) {
  using sm = strict_mode;
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  if (opt.strict == sm::log_unexpected || opt.strict == sm::log_all) {
    auto log = [&](const std::string& msg) {
      if (opt.log)
        opt.log(msg);
      else
        std::fprintf(stderr, "cairn: %s\n", msg.c_str());
    };
    if (!stats.unexpected.empty())
      log("rank " + std::to_string(rank) +
          ": keys not in the checkpoint (skipped): " + joined(stats.unexpected));
    if (!stats.missing.empty() && rank == 0)
      log("checkpoint keys nobody loads: " + joined(stats.missing));
  }
  if ((opt.strict == sm::raise_unexpected || opt.strict == sm::raise_all) &&
      !stats.unexpected.empty())
    return make_error(errc::not_found, "keys not in the checkpoint: " + joined(stats.unexpected))
        .with_key(stats.unexpected.front());
  if (opt.strict == sm::raise_all && !stats.missing.empty())
    return make_error(errc::not_found, "checkpoint keys nobody loads: " + joined(stats.missing))
        .with_key(stats.missing.front());
  return ok();
}

}  // namespace cairn::detail
