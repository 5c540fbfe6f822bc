// cairn/format/stream/writers-inl.hpp: the bodies of cairn/format/stream/writers.hpp (included
// by it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <charconv>

#include "cairn/format/stream/writers.hpp"

namespace cairn::stream::detail {

CAIRN_INLINE std::map<std::string, stream_writer, std::less<>>& stream_writers() {
  static std::map<std::string, stream_writer, std::less<>> writers;
  return writers;
}

CAIRN_INLINE result<std::uint64_t> parse_count(std::string_view name, std::string_view text) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    return make_error(errc::invalid_argument, "setting " + std::string(name) +
                                                  " must be a whole number of bytes, not '" +
                                                  std::string(text) + "'");
  return n;
}

}  // namespace cairn::stream::detail

namespace cairn::stream {

CAIRN_INLINE result<bool> register_stream_writer(stream_writer w) {
  auto& all = detail::stream_writers();
  std::vector<std::string> names = w.aliases;
  names.push_back(w.name);
  for (const auto& [n, other] : all) {
    if (n == w.name) continue;  // replaced
    for (const auto& name : names)
      if (name == other.name ||
          std::find(other.aliases.begin(), other.aliases.end(), name) != other.aliases.end())
        return make_error(
            errc::already_exists,
            "the stream writer name '" + name + "' is taken by the writer '" + other.name + "'");
  }
  std::string key = w.name;
  all.insert_or_assign(std::move(key), std::move(w));
  return true;
}

CAIRN_INLINE result<const stream_writer*> find_stream_writer(std::string_view name) {
  for (const auto& [n, w] : detail::stream_writers())
    if (n == name || std::find(w.aliases.begin(), w.aliases.end(), name) != w.aliases.end())
      return &w;
  std::string known;
  for (const auto& [n, w] : detail::stream_writers()) {
    known += known.empty() ? "" : ", ";
    known += n;
    for (const auto& a : w.aliases) known += " or " + a;
  }
  return make_error(errc::not_found, "unknown output format '" + std::string(name) + "' (" +
                                         (known.empty() ? "none registered" : known) + ")");
}

CAIRN_INLINE std::vector<std::string> stream_writer_names() {
  std::vector<std::string> out;
  for (const auto& [n, w] : detail::stream_writers()) out.push_back(n);
  return out;
}

}  // namespace cairn::stream
