// cairn/core/error-inl.hpp: the bodies of cairn/core/error.hpp (included by it when header-only;
// compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <new>
#include <type_traits>

#include "cairn/core/error.hpp"

namespace cairn {

CAIRN_INLINE std::string error::describe() const {
  std::string s = errc_name(code);
  s += ": ";
  s += message;
  std::string ctx;
  auto add = [&](const char* name, const std::string& v) {
    if (v.empty()) return;
    if (!ctx.empty()) ctx += ' ';
    ctx += name;
    ctx += '=';
    ctx += v;
  };
  add("key", key);
  add("rank", rank >= 0 ? std::to_string(rank) : std::string());
  add("file", file);
  add("offset", offset ? std::to_string(*offset) : std::string());
  if (!ctx.empty()) s += " [" + ctx + "]";
  return s;
}

CAIRN_INLINE error error::with_key(std::string k) && {
  if (key.empty()) key = std::move(k);
  return std::move(*this);
}

CAIRN_INLINE error error::with_rank(int r) && {
  if (rank < 0) rank = r;
  return std::move(*this);
}

CAIRN_INLINE error error::with_file(std::string f) && {
  if (file.empty()) file = std::move(f);
  return std::move(*this);
}

CAIRN_INLINE error make_error(errc code, std::string message) {
  error e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE error current_exception_error(const char* what) noexcept {
  try {
    throw;
  } catch (const exception& e) {
    return e.err();
  } catch (const std::bad_alloc&) {
    return make_error(errc::resource, std::string("out of memory while ") + what);
  } catch (const std::exception& e) {
    return make_error(errc::io, std::string(what) + " failed: " + e.what());
  } catch (...) {
    return make_error(errc::io, std::string(what) + " failed: unknown exception");
  }
}

}  // namespace cairn::detail
