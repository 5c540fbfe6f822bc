// cairn/core/error.hpp: the error type and result<T> every fallible cairn call returns.
//
// Depends on the standard library only, so it compiles under nvcc.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "cairn/detail/config.hpp"

namespace cairn {

/// What kind of failure an `error` reports.
enum class errc {
  io,                     ///< the OS or a server refused a read or write
  corrupt,                ///< a checksum did not match or a file is malformed
  incomplete_checkpoint,  ///< the directory has no committed metadata
  invalid_argument,       ///< the caller passed something inconsistent
  mismatch,               ///< dtype, shape or structure differs between ranks or checkpoint
  not_found,              ///< a key or object is missing
  already_exists,         ///< the checkpoint exists and overwrite was not asked for
  integrity,              ///< shards overlap, leave gaps or disagree across ranks
  unsupported_version,    ///< the checkpoint was written by a newer format version
  comm,                   ///< a collective failed or another rank reported an error
  resource,               ///< memory ran out, or a size read from a file exceeds what cairn accepts
};

/// A short lower-case name for an error code, e.g. "corrupt".
constexpr const char* errc_name(errc c) noexcept {
  switch (c) {
    case errc::io:
      return "io";
    case errc::corrupt:
      return "corrupt";
    case errc::incomplete_checkpoint:
      return "incomplete checkpoint";
    case errc::invalid_argument:
      return "invalid argument";
    case errc::mismatch:
      return "mismatch";
    case errc::not_found:
      return "not found";
    case errc::already_exists:
      return "already exists";
    case errc::integrity:
      return "integrity";
    case errc::unsupported_version:
      return "unsupported version";
    case errc::comm:
      return "comm";
    case errc::resource:
      return "resource";
  }
  return "unknown";
}

/// A failure with the context needed to act on it: the key, rank, file and byte offset involved.
/// Fields that do not apply stay empty (`rank == -1`, no offset).
struct error {
  errc code = errc::io;
  std::string message;                  ///< what went wrong, including the OS or server message
  std::string key;                      ///< the checkpoint key involved, if any
  int rank = -1;                        ///< the rank that saw the failure, if known
  std::string file;                     ///< the file or object involved, if any
  std::optional<std::uint64_t> offset;  ///< byte offset inside `file`, if known

  /// One line naming everything known: "corrupt: checksum mismatch [key=w rank=1 file=...
  /// offset=...]".
  std::string describe() const;

  /// Fluent setters used while an error travels up through layers that know more context: each
  /// sets its field when still empty and returns the error by value (so `e = std::move(e)...`
  /// and chains on temporaries are safe).
  error with_key(std::string k) &&;
  error with_rank(int r) &&;
  error with_file(std::string f) &&;
};

/// Builds an error in one expression: `make_error(errc::corrupt, "bad magic")`.
CAIRN_INLINE error make_error(errc code, std::string message);

/// The exception the throwing forms of the API raise; it carries the structured `error`.
class exception : public std::runtime_error {
 public:
  explicit exception(error e) : std::runtime_error(e.describe()), error_(std::move(e)) {}
  /// The structured error behind `what()`.
  const cairn::error& err() const noexcept { return error_; }

 private:
  cairn::error error_;
};

/// Either a value or an `error` (g++ 12 has no std::expected). `value()` throws `cairn::exception`.
template <class T>
class [[nodiscard]] result {
 public:
  result(T v) : v_(std::in_place_index<0>, std::move(v)) {}      // NOLINT(implicit)
  result(error e) : v_(std::in_place_index<1>, std::move(e)) {}  // NOLINT(implicit)

  /// True when a value is held.
  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value, or throws `cairn::exception` with the error.
  T& value() & {
    throw_if_error();
    return std::get<0>(v_);
  }
  const T& value() const& {
    throw_if_error();
    return std::get<0>(v_);
  }
  /// On a temporary result, the value is moved out (not referenced), so that
  /// `for (auto& x : f().value())` does not dangle.
  T value() && {
    throw_if_error();
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only valid when `!has_value()`.
  const error& err() const& { return std::get<1>(v_); }
  error err() && { return std::get<1>(std::move(v_)); }

 private:
  void throw_if_error() const {
    if (!has_value()) throw exception(std::get<1>(v_));
  }
  std::variant<T, error> v_;
};

/// result<void>: success or an error.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(error e) : e_(std::move(e)) {}  // NOLINT(implicit)

  bool has_value() const noexcept { return !e_.has_value(); }
  explicit operator bool() const noexcept { return has_value(); }
  /// Throws `cairn::exception` when an error is held.
  void value() const {
    if (e_) throw exception(*e_);
  }
  const error& err() const& { return *e_; }
  error err() && { return std::move(*e_); }

 private:
  std::optional<error> e_;
};

/// Success for result<void>: `return cairn::ok();`.
inline result<void> ok() { return {}; }

namespace detail {

/// The exception being handled (call only inside a `catch`) as an error: `cairn::exception`
/// gives its error, `std::bad_alloc` errc::resource ("out of memory while <what>"), any other
/// `std::exception` errc::io with its message.
CAIRN_INLINE error current_exception_error(const char* what) noexcept;

/// Runs `f` (which returns a result) and turns anything it throws into an error (see
/// `current_exception_error`), so that no exception other than `cairn::exception` leaves a
/// throwing API call and none leaves a `try_*` one.
template <class F>
auto catch_all(const char* what, F&& f) noexcept -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    return current_exception_error(what);
  }
}

}  // namespace detail

}  // namespace cairn

/// Propagates an error from an expression returning result<...>; evaluates to nothing.
#define CAIRN_TRY(expr)                                      \
  do {                                                       \
    auto&& cairn_try_r_ = (expr);                            \
    if (!cairn_try_r_) return std::move(cairn_try_r_).err(); \
  } while (0)

#define CAIRN_CONCAT_INNER_(a, b) a##b
#define CAIRN_CONCAT_(a, b) CAIRN_CONCAT_INNER_(a, b)
/// `CAIRN_TRY_ASSIGN(auto x, f());` declares x from f()'s value or returns its error.
#define CAIRN_TRY_ASSIGN(decl, expr) \
  CAIRN_TRY_ASSIGN_IMPL_(CAIRN_CONCAT_(cairn_r_, __LINE__), decl, expr)
#define CAIRN_TRY_ASSIGN_IMPL_(tmp, decl, expr) \
  auto tmp = (expr);                            \
  if (!tmp) return std::move(tmp).err();        \
  decl = std::move(tmp).value()

#if CAIRN_HEADER_ONLY
#  include "cairn/core/error-inl.hpp"
#endif
