// cairn/convert/masters-inl.hpp: the bodies of cairn/convert/masters.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "cairn/convert/masters.hpp"
#include "cairn/core/sharded_object.hpp"
#include "cairn/format/dcp/reader.hpp"

namespace cairn::convert::detail {

/// A source through a key selection (`select_keys`).
class selected_source final : public source {
 public:
  selected_source(source& inner, key_selector select) : inner_(inner), select_(std::move(select)) {}

  /// Renames the tensors; fails when two take one key.
  result<void> init() {
    std::map<std::string, std::string> from;  // output key -> source key
    for (const tensor_entry& t : inner_.tensors()) {
      std::optional<std::string> out = select_(t.key);
      if (!out) continue;
      auto [it, fresh] = from.emplace(*out, t.key);
      if (!fresh)
        return make_error(errc::invalid_argument, "select_keys: both '" + it->second + "' and '" +
                                                      t.key + "' would be written as '" + *out +
                                                      "'")
            .with_key(*out);
      tensor_entry e = t;
      e.key = *out;
      tensors_.push_back(std::move(e));
    }
    std::sort(tensors_.begin(), tensors_.end(),
              [](const tensor_entry& a, const tensor_entry& b) { return a.key < b.key; });
    source_key_ = std::move(from);
    return ok();
  }

  std::string_view kind() const noexcept override { return inner_.kind(); }
  const std::vector<tensor_entry>& tensors() const noexcept override { return tensors_; }

  result<void> read(const std::vector<box_read>& reqs) override {
    std::vector<box_read> inner_reqs;
    inner_reqs.reserve(reqs.size());
    for (const box_read& r : reqs) {
      auto it = source_key_.find(r.key);
      if (it == source_key_.end())
        return make_error(errc::not_found, "no such tensor").with_key(r.key);
      inner_reqs.push_back({it->second, r.region, r.out});
    }
    return inner_.read(inner_reqs);
  }

  result<std::map<std::string, common_value>> commons() override {
    CAIRN_TRY_ASSIGN(auto all, inner_.commons());
    std::map<std::string, common_value> out;
    std::map<std::string, std::string> from;
    for (auto& [path, value] : all) {
      std::optional<std::string> to = select_(path);
      if (!to) continue;
      auto [it, fresh] = from.emplace(*to, path);
      if (!fresh)
        return make_error(errc::invalid_argument, "select_keys: both common values '" + it->second +
                                                      "' and '" + path + "' would be written as '" +
                                                      *to + "'")
            .with_key(*to);
      out.emplace(*to, std::move(value));
    }
    return out;
  }

  std::map<std::string, std::string> content_metadata() const override {
    return inner_.content_metadata();
  }

  std::vector<std::string> other_items() const override {
    std::vector<std::string> out;
    for (const std::string& item : inner_.other_items())
      if (std::optional<std::string> to = renamed_item(item)) out.push_back(std::move(*to));
    return out;
  }

  result<std::map<std::string, object_entry>> objects() override {
    CAIRN_TRY_ASSIGN(auto all, inner_.objects());
    std::map<std::string, object_entry> out;
    for (auto& [unique, entry] : all) {
      std::optional<std::string> to = select_(entry.key);
      if (!to) continue;
      entry.key = std::move(*to);
      out.emplace(object_unique_key(entry.key, entry.global_offset, entry.global_shape),
                  std::move(entry));
    }
    return out;
  }

  std::optional<int> world_size() const override { return inner_.world_size(); }

 private:
  /// A sharded object's unique key (`rng/shard_0_4`) selected by its key; other items (DCP's
  /// pickled values) by their name.
  std::optional<std::string> renamed_item(const std::string& item) const {
    if (auto parsed = cairn::detail::parse_object_unique_key(item)) {
      auto& [key, offset, global] = *parsed;
      std::optional<std::string> to = select_(key);
      if (!to) return std::nullopt;
      return object_unique_key(*to, offset, global);
    }
    return select_(item);
  }

  source& inner_;
  key_selector select_;
  std::vector<tensor_entry> tensors_;
  std::map<std::string, std::string> source_key_;  // output key -> source key
};

/// `key` begins with the components of `prefix` ("" begins every key).
inline bool under(std::string_view key, std::string_view prefix) {
  return prefix.empty() ||
         (key.size() > prefix.size() && key.starts_with(prefix) && key[prefix.size()] == '.');
}

/// Where the component sequence `part` ("state.fp32_param.") starts in `key` at a component
/// boundary, or npos.
inline std::size_t find_components(std::string_view key, std::string_view part) {
  for (std::size_t at = key.find(part); at != std::string_view::npos; at = key.find(part, at + 1))
    if (at == 0 || key[at - 1] == '.') return at;
  return std::string_view::npos;
}

}  // namespace cairn::convert::detail

namespace cairn::convert {

CAIRN_INLINE result<std::unique_ptr<source>> select_keys(source& src, key_selector select) {
  if (!select) return make_error(errc::invalid_argument, "select_keys: no selection given");
  auto view = std::make_unique<detail::selected_source>(src, std::move(select));
  CAIRN_TRY(view->init());
  return std::unique_ptr<source>(std::move(view));
}

CAIRN_INLINE result<key_selector> fp32_masters(const source& src) {
  // The optimizers' roots ("optim", "optimizer"; "" for a tree that is only an optimizer) and
  // each master found: its source key and the name or key of its parameter.
  struct found {
    std::string key, root, name;
    bool exact = false;  // Megatron's: `name` is the model key itself
  };
  std::vector<found> masters;
  auto root_of = [](std::string_view key, std::size_t at) {
    return std::string(key.substr(0, at == 0 ? 0 : at - 1));
  };
  for (const tensor_entry& t : src.tensors()) {
    std::string_view k = t.key;
    constexpr std::string_view megatron = "state.fp32_param.", reshardable = "state.param.",
                               suffix = ".fp32_param";
    if (std::size_t at = detail::find_components(k, megatron); at != std::string_view::npos) {
      masters.push_back({t.key, root_of(k, at), std::string(k.substr(at + megatron.size())), true});
    } else if (std::size_t at2 = detail::find_components(k, reshardable);
               at2 != std::string_view::npos && src.find(k.substr(at2 + reshardable.size()))) {
      masters.push_back(
          {t.key, root_of(k, at2), std::string(k.substr(at2 + reshardable.size())), true});
    } else if (k.ends_with(suffix)) {
      std::size_t at3 = detail::find_components(k, "state.");
      if (at3 == std::string_view::npos || at3 + 6 >= k.size() - suffix.size()) continue;
      masters.push_back({t.key, root_of(k, at3),
                         std::string(k.substr(at3 + 6, k.size() - suffix.size() - at3 - 6)),
                         false});
    }
  }
  if (masters.empty())
    return make_error(errc::invalid_argument,
                      "fp32_masters: this " + std::string(src.kind()) +
                          " checkpoint holds no fp32 master weights (an optimizer's "
                          "state.<name>.fp32_param as cairn's libtorch adapter saves them with "
                          "masters, or Megatron's optimizer.state.fp32_param.<key>)");
  std::set<std::string> roots;
  for (const found& m : masters) roots.insert(m.root);
  auto in_optimizer = [roots](std::string_view key) {
    for (const std::string& r : roots)
      if (r.empty() ? key.starts_with("state.") || key.starts_with("param_groups.")
                    : detail::under(key, r))
        return true;
    return false;
  };
  // The tensors outside every optimizer by their reversed keys, sorted: the keys that end with
  // a name are then one range (each master is found in log time, not by a scan).
  std::vector<std::string> model_reversed;
  for (const tensor_entry& t : src.tensors())
    if (!in_optimizer(t.key)) model_reversed.emplace_back(t.key.rbegin(), t.key.rend());
  std::sort(model_reversed.begin(), model_reversed.end());
  auto rename = std::make_shared<std::map<std::string, std::string>>();  // master -> model key
  auto replaced = std::make_shared<std::set<std::string>>();             // model keys replaced
  for (const found& m : masters) {
    std::string target;
    if (m.exact) {
      target = m.name;
    } else {
      std::vector<std::string> candidates;  // the model keys that are the name or end with .name
      const std::string name_reversed(m.name.rbegin(), m.name.rend());
      for (auto it = std::lower_bound(model_reversed.begin(), model_reversed.end(), name_reversed);
           it != model_reversed.end() && it->starts_with(name_reversed); ++it)
        if (it->size() == name_reversed.size() || (*it)[name_reversed.size()] == '.')
          candidates.emplace_back(it->rbegin(), it->rend());
      if (candidates.size() != 1) {
        std::string list;
        for (const auto& c : candidates) list += (list.empty() ? "" : ", ") + c;
        return make_error(
                   errc::invalid_argument,
                   "fp32_masters: the master '" + m.key + "' is of parameter '" + m.name +
                       "', and " +
                       (candidates.empty() ? "no model tensor is called so or ends with ." + m.name
                                           : "several model tensors end with it: " + list))
            .with_key(m.key);
      }
      target = candidates.front();
    }
    if (const tensor_entry* t = src.find(target)) {
      const tensor_entry* master = src.find(m.key);
      if (t->global_shape != master->global_shape)
        return make_error(errc::invalid_argument,
                          "fp32_masters: the master '" + m.key + "' has shape " +
                              shape_str(master->global_shape) + ", its parameter '" + target +
                              "' " + shape_str(t->global_shape))
            .with_key(m.key);
    }
    if (!replaced->insert(target).second)
      return make_error(errc::invalid_argument,
                        "fp32_masters: two masters are of the parameter '" + target + "'")
          .with_key(m.key);
    rename->emplace(m.key, target);
  }
  return key_selector(
      [rename, replaced, in_optimizer](std::string_view key) -> std::optional<std::string> {
        std::string k(key);
        if (auto it = rename->find(k); it != rename->end()) return it->second;
        if (replaced->count(k) || in_optimizer(key)) return std::nullopt;
        return k;
      });
}

}  // namespace cairn::convert
