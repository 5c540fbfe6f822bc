// cairn/storage/pointer-inl.hpp: the bodies of cairn/storage/pointer.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <span>

#include "cairn/storage/names.hpp"
#include "cairn/storage/pointer.hpp"

namespace cairn::detail {

CAIRN_INLINE result<std::optional<std::string>> read_pointer(storage_ref root,
                                                             std::string_view ptr) {
  auto size = root.size(ptr);
  if (!size && size.err().code == errc::not_found) return std::optional<std::string>();
  if (!size) return size.err();
  if (*size > 4096) return std::optional<std::string>();  // not a pointer
  std::string text(*size, '\0');
  CAIRN_TRY(root.read(ptr, 0, std::as_writable_bytes(std::span(text))));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r'))
    text.pop_back();
  if (text.empty() || text.find('/') != std::string::npos || !object_name_problem(text).empty())
    return std::optional<std::string>();
  return std::optional<std::string>(std::move(text));
}

CAIRN_INLINE result<void> write_pointer(storage_ref root,
                                        std::string_view ptr,
                                        const std::string& name) {
  const std::string text = name + "\n";
  return root.put(ptr, std::as_bytes(std::span(text)));
}

}  // namespace cairn::detail
