// cairn/storage/names-inl.hpp: the bodies of cairn/storage/names.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/storage/names.hpp"

namespace cairn {

CAIRN_INLINE std::string object_name_problem(std::string_view name) {
  if (name.empty()) return "an object name must not be empty";
  if (name.find('\0') != std::string_view::npos) return "an object name must not contain NUL";
  if (name.front() == '/') return "an object name must be relative, not absolute";
  std::size_t start = 0;
  while (true) {
    std::size_t end = name.find('/', start);
    std::string_view part =
        name.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (part.empty())
      return "an object name must not contain empty components ('//' or a trailing '/')";
    if (part == "." || part == "..")
      return "an object name must not contain '.' or '..' components";
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return {};
}

CAIRN_INLINE result<void> check_object_name(std::string_view name) {
  std::string why = object_name_problem(name);
  if (why.empty()) return ok();
  error e = make_error(errc::invalid_argument, why + ": \"" + std::string(name) + "\"");
  return e;
}

CAIRN_INLINE result<void> check_list_prefix(std::string_view prefix) {
  if (prefix.empty()) return ok();
  std::size_t slash = prefix.rfind('/');
  bool bad =
      prefix.front() == '/' || prefix.find('\0') != std::string_view::npos ||
      (slash != std::string_view::npos && !object_name_problem(prefix.substr(0, slash)).empty());
  if (!bad) return ok();
  return make_error(errc::invalid_argument,
                    "a list prefix must be relative with no empty, '.' or '..' components: \"" +
                        std::string(prefix) + "\"");
}

}  // namespace cairn
