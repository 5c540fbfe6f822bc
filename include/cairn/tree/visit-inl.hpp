// cairn/tree/visit-inl.hpp: the bodies of cairn/tree/visit.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/tree/visit.hpp"

namespace cairn::detail {

CAIRN_INLINE std::string join_path(const std::string& parent, std::string_view name) {
  if (parent.empty()) return std::string(name);
  if (name.empty()) return parent;
  std::string p = parent;
  p += '.';
  p += name;
  return p;
}

CAIRN_INLINE void flattener::visit_factory(factory& v, const std::string& path) {
  if (!v.build) return;
  auto built = std::make_shared<state_dict>(v.build());
  out.keep_alive.push_back(built);
  visit_checked(*built, path);
  if (v.merge)
    out.after_load.push_back([built, merge = v.merge]() -> result<void> { return merge(*built); });
}

CAIRN_INLINE void flattener::visit_state_dict(state_dict& v, const std::string& path) {
  for (auto& [name, entry] : v.entries()) {
    std::string p = join_path(path, name);
    std::visit(
        [&](auto& e) {
          using E = std::remove_cvref_t<decltype(e)>;
          if constexpr (std::is_same_v<E, std::unique_ptr<state_dict>>) {
            if (e) visit_checked(*e, p);
          } else if constexpr (std::is_same_v<E, common_value>) {
            visit_dict_common(e, p);
          } else {
            visit_checked(e, p);
          }
        },
        entry);
  }
}

CAIRN_INLINE void flattener::visit_dict_common(common_value& e, const std::string& path) {
  common_leaf leaf;
  leaf.path = path;
  leaf.value = &e;
  leaf.encode = [](const void* q) { return *static_cast<const common_value*>(q); };
  leaf.decode = [](const common_value& in, void* q) -> result<void> {
    auto& target = *static_cast<common_value*>(q);
    if (target.kind != in.kind || (in.kind != common_kind::string && target.type != in.type))
      return make_error(errc::mismatch, "stored common value is " + in.describe_type() +
                                            ", the entry is " + target.describe_type() +
                                            ": declare the entry with the saved type");
    target = in;
    return ok();
  };
  out.commons.push_back(std::move(leaf));
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE leaf_list flatten(state_dict& tree) {
  leaf_list out;
  detail::flattener f{out};
  f.visit(tree, std::string());
  return out;
}

}  // namespace cairn
