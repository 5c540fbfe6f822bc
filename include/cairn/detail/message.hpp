// cairn/detail/message.hpp: the one codec of what ranks exchange (plans, votes, reports, pieces)
// and of the records a writer reports. A message is a plain struct; the codec walks its fields
// (Boost.PFR), so a message is declared once and its encoder and decoder cannot drift apart.
//
//     struct vote_message { std::uint64_t structure; std::optional<error> status; };
//     bytes b = detail::encode_message(vote_message{...});
//     result<vote_message> v = detail::decode_message<vote_message>(b);   // never throws
//
// Fields may be: bool, integers, floating point, enums, std::byte, std::string, std::vector,
// std::optional, std::pair, std::array, std::map, std::variant, and structs of those (nested
// aggregates). Encoding is little-endian and fixed-width (numbers), length-prefixed (strings,
// vectors, maps: a u64 count), flag-prefixed (optional: one byte 0/1) and index-prefixed
// (variant: one byte). A type that is not an aggregate specializes `message_traits`.
//
// Decoding checks every count against the bytes left before allocating, every flag and index
// against its range, that a map's keys come in order and once, and that the whole input was
// used (so an accepted input is the one encoding of its value): a truncated, padded or lying
// message is an `errc::comm` error naming the message and the byte offset, never a crash or a huge
// allocation. Messages travel between ranks of one job (one build of cairn): the encoding is not
// a file format and is not versioned.
#pragma once

#include <array>
#include <boost/pfr.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/core/bytes.hpp"
#include "cairn/core/error.hpp"

namespace cairn::detail {

/// Appends the encoding of values to a byte buffer.
class message_writer {
 public:
  /// Appends `n` bytes from `p`.
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  /// Appends a count (of a string's bytes, a vector's or a map's elements).
  void count(std::size_t n) {
    std::uint64_t v = n;
    raw(&v, sizeof v);
  }
  /// The bytes written so far.
  bytes& data() noexcept { return buf_; }

 private:
  bytes buf_;
};

/// Reads encoded values back; every read returns false (and remembers where) when the input
/// does not hold what it claims.
class message_reader {
 public:
  explicit message_reader(std::span<const std::byte> b) noexcept : b_(b) {}
  /// Reads `n` bytes into `p`; false when fewer are left.
  bool raw(void* p, std::size_t n) noexcept {
    if (n > b_.size() - pos_) return fail("truncated");
    if (n) std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  /// Reads a count of elements that take at least `min_each` bytes each; false when the bytes
  /// left cannot hold that many (so a lying count never allocates).
  bool count(std::size_t& n, std::size_t min_each) {
    std::uint64_t v = 0;
    if (!raw(&v, sizeof v)) return false;
    if (v > (b_.size() - pos_) / (min_each ? min_each : 1)) {
      pos_ -= sizeof v;
      return fail("truncated (a count of " + std::to_string(v) + " does not fit)");
    }
    n = static_cast<std::size_t>(v);
    return true;
  }
  /// Marks the input malformed at byte `at` (default: the current offset); returns false.
  bool fail(std::string why, std::size_t at = static_cast<std::size_t>(-1)) {
    if (why_.empty()) {
      why_ = std::move(why);
      at_ = at == static_cast<std::size_t>(-1) ? pos_ : at;
    }
    return false;
  }
  /// The offset of the next byte to read.
  std::size_t position() const noexcept { return pos_; }
  /// Bytes not read yet.
  std::size_t left() const noexcept { return b_.size() - pos_; }
  /// The input's size.
  std::size_t size() const noexcept { return b_.size(); }
  /// What was wrong, and at which byte offset (after a read returned false).
  const std::string& why() const noexcept { return why_; }
  std::size_t at() const noexcept { return at_; }

 private:
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
  std::string why_;
  std::size_t at_ = 0;
};

/// Specialize for a message field type that is not an aggregate:
/// `static void write(message_writer&, const T&)`, `static bool read(message_reader&, T&)` and
/// `static constexpr std::size_t min_size` (the fewest bytes its encoding takes).
template <class T>
struct message_traits;

namespace message_impl {

template <class T, template <class...> class Template>
inline constexpr bool is_a = false;
template <template <class...> class Template, class... A>
inline constexpr bool is_a<Template<A...>, Template> = true;

template <class T>
inline constexpr bool is_std_array = false;
template <class T, std::size_t N>
inline constexpr bool is_std_array<std::array<T, N>> = true;

template <class T>
concept has_traits = requires {
  message_traits<T>::min_size;
};

/// Numbers and bytes copied as they are in memory (little-endian on every platform cairn runs).
template <class T>
inline constexpr bool is_plain =
    (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || std::is_same_v<T, std::byte>;

template <class T>
constexpr std::size_t min_size();

template <class T, std::size_t... I>
constexpr std::size_t fields_min_size(std::index_sequence<I...>) {
  return (std::size_t{0} + ... + min_size<boost::pfr::tuple_element_t<I, T>>());
}

/// The fewest bytes an encoded `T` takes: bounds the counts a reader accepts.
template <class T>
constexpr std::size_t min_size() {
  if constexpr (has_traits<T>) {
    return message_traits<T>::min_size;
  } else if constexpr (std::is_same_v<T, bool>) {
    return 1;
  } else if constexpr (std::is_enum_v<T>) {
    return sizeof(std::underlying_type_t<T>);
  } else if constexpr (is_plain<T>) {
    return sizeof(T);
  } else if constexpr (is_a<T, std::basic_string> || is_a<T, std::vector> || is_a<T, std::map>) {
    return 8;
  } else if constexpr (is_a<T, std::optional> || is_a<T, std::variant>) {
    return 1;
  } else if constexpr (is_a<T, std::pair>) {
    return min_size<typename T::first_type>() + min_size<typename T::second_type>();
  } else if constexpr (is_std_array<T>) {
    return std::tuple_size_v<T> * min_size<typename T::value_type>();
  } else {
    static_assert(std::is_aggregate_v<T>,
                  "a message field must be a number, enum, string, standard container, "
                  "aggregate, or have message_traits");
    return fields_min_size<T>(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
  }
}

template <class T>
void write(message_writer& w, const T& v);
template <class T>
bool read(message_reader& r, T& v);

/// Reads alternative `index` of a variant (checked against its size by the caller).
template <class Variant, std::size_t I = 0>
bool read_alternative(message_reader& r, Variant& v, std::size_t index) {
  if constexpr (I < std::variant_size_v<Variant>) {
    if (index == I) return read(r, v.template emplace<I>());
    return read_alternative<Variant, I + 1>(r, v, index);
  } else {
    return false;
  }
}

template <class T>
void write(message_writer& w, const T& v) {
  if constexpr (has_traits<T>) {
    message_traits<T>::write(w, v);
  } else if constexpr (std::is_same_v<T, bool>) {
    const std::uint8_t b = v ? 1 : 0;
    w.raw(&b, 1);
  } else if constexpr (std::is_enum_v<T>) {
    const auto u = static_cast<std::underlying_type_t<T>>(v);
    w.raw(&u, sizeof u);
  } else if constexpr (is_plain<T>) {
    w.raw(&v, sizeof v);
  } else if constexpr (is_a<T, std::basic_string>) {
    w.count(v.size());
    w.raw(v.data(), v.size() * sizeof(typename T::value_type));
  } else if constexpr (is_a<T, std::vector>) {
    using E = typename T::value_type;
    static_assert(!std::is_same_v<E, bool>, "std::vector<bool> is not a message field");
    w.count(v.size());
    if constexpr (is_plain<E>) {
      w.raw(v.data(), v.size() * sizeof(E));
    } else {
      for (const E& e : v) write(w, e);
    }
  } else if constexpr (is_a<T, std::map>) {
    w.count(v.size());
    for (const auto& [k, e] : v) {
      write(w, k);
      write(w, e);
    }
  } else if constexpr (is_a<T, std::optional>) {
    write(w, v.has_value());
    if (v) write(w, *v);
  } else if constexpr (is_a<T, std::variant>) {
    static_assert(std::variant_size_v<T> < 256);
    const auto index = static_cast<std::uint8_t>(v.index());
    w.raw(&index, 1);
    std::visit([&](const auto& alt) { write(w, alt); }, v);
  } else if constexpr (is_a<T, std::pair>) {
    write(w, v.first);
    write(w, v.second);
  } else if constexpr (is_std_array<T>) {
    for (const auto& e : v) write(w, e);
  } else {
    static_assert(std::is_aggregate_v<T>, "a message must be an aggregate or have message_traits");
    boost::pfr::for_each_field(v, [&](const auto& f) { write(w, f); });
  }
}

template <class T>
bool read(message_reader& r, T& v) {
  if constexpr (has_traits<T>) {
    return message_traits<T>::read(r, v);
  } else if constexpr (std::is_same_v<T, bool>) {
    std::uint8_t b = 0;
    const std::size_t at = r.position();
    if (!r.raw(&b, 1)) return false;
    if (b > 1) return r.fail("a flag is " + std::to_string(b) + ", not 0 or 1", at);
    v = b == 1;
    return true;
  } else if constexpr (std::is_enum_v<T>) {
    std::underlying_type_t<T> u{};
    if (!r.raw(&u, sizeof u)) return false;
    v = static_cast<T>(u);
    return true;
  } else if constexpr (is_plain<T>) {
    return r.raw(&v, sizeof v);
  } else if constexpr (is_a<T, std::basic_string>) {
    std::size_t n = 0;
    if (!r.count(n, sizeof(typename T::value_type))) return false;
    v.resize(n);
    return r.raw(v.data(), n * sizeof(typename T::value_type));
  } else if constexpr (is_a<T, std::vector>) {
    using E = typename T::value_type;
    std::size_t n = 0;
    if (!r.count(n, min_size<E>())) return false;
    v.clear();
    v.resize(n);
    if constexpr (is_plain<E>) {
      return r.raw(v.data(), n * sizeof(E));
    } else {
      for (E& e : v)
        if (!read(r, e)) return false;
      return true;
    }
  } else if constexpr (is_a<T, std::map>) {
    std::size_t n = 0;
    if (!r.count(n, min_size<typename T::key_type>() + min_size<typename T::mapped_type>()))
      return false;
    v.clear();
    for (std::size_t i = 0; i < n; ++i) {
      typename T::key_type k{};
      typename T::mapped_type e{};
      const std::size_t at = r.position();
      if (!read(r, k)) return false;
      // One encoding per map: keys in order, each once (as the writer sends them).
      if (!v.empty() && !v.key_comp()(std::prev(v.end())->first, k))
        return r.fail("a map's keys are out of order or repeated", at);
      if (!read(r, e)) return false;
      v.emplace_hint(v.end(), std::move(k), std::move(e));
    }
    return true;
  } else if constexpr (is_a<T, std::optional>) {
    bool has = false;
    if (!read(r, has)) return false;
    if (!has) {
      v.reset();
      return true;
    }
    return read(r, v.emplace());
  } else if constexpr (is_a<T, std::variant>) {
    std::uint8_t index = 0;
    const std::size_t at = r.position();
    if (!r.raw(&index, 1)) return false;
    if (index >= std::variant_size_v<T>)
      return r.fail("a variant's index is " + std::to_string(index) + " of " +
                        std::to_string(std::variant_size_v<T>),
                    at);
    return read_alternative(r, v, index);
  } else if constexpr (is_a<T, std::pair>) {
    return read(r, v.first) && read(r, v.second);
  } else if constexpr (is_std_array<T>) {
    for (auto& e : v)
      if (!read(r, e)) return false;
    return true;
  } else {
    bool ok = true;
    boost::pfr::for_each_field(v, [&](auto& f) { ok = ok && read(r, f); });
    return ok;
  }
}

/// The name a message goes by in errors: `T::message_name` when it has one.
template <class T>
constexpr std::string_view name_of() {
  if constexpr (requires { T::message_name; }) {
    return T::message_name;
  } else {
    return "message";
  }
}

}  // namespace message_impl

/// Appends the encoding of `v` to `w` (a message inside a larger one).
template <class T>
void write_message(message_writer& w, const T& v) {
  message_impl::write(w, v);
}

/// Reads a `T` from `r` (a message inside a larger one); false when the input is malformed.
template <class T>
bool read_message(message_reader& r, T& v) {
  return message_impl::read(r, v);
}

/// The encoding of `v`.
template <class T>
bytes encode_message(const T& v) {
  message_writer w;
  message_impl::write(w, v);
  return std::move(w.data());
}

/// The error for input that `r` found malformed, or that has bytes left over.
inline error message_error(const message_reader& r, std::string_view what) {
  const bool leftover = r.why().empty();
  const std::string why = leftover ? std::to_string(r.left()) + " bytes left over" : r.why();
  const std::size_t at = leftover ? r.size() - r.left() : r.at();
  return make_error(errc::comm, "malformed " + std::string(what) + " between ranks: " + why +
                                    " at byte " + std::to_string(at) + " of " +
                                    std::to_string(r.size()));
}

/// Decodes a `T` that must fill `b` exactly. Never throws (but for memory exhaustion): a
/// malformed input is an `errc::comm` error naming `what` (default: `T::message_name`) and the
/// byte offset.
template <class T>
result<T> decode_message(std::span<const std::byte> b,
                         std::string_view what = message_impl::name_of<T>()) {
  message_reader r(b);
  T v{};
  if (!message_impl::read(r, v) || r.left() != 0) return message_error(r, what);
  return v;
}

}  // namespace cairn::detail
