// cairn/manager/names-inl.hpp: the bodies of cairn/manager/names.hpp (included by it when
// header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <charconv>
#include <utility>

#include "cairn/manager/names.hpp"

namespace cairn {

CAIRN_INLINE result<name_template> name_template::parse(std::string_view text) {
  name_template t;
  t.text_ = std::string(text);
  auto bad = [&](const std::string& why) -> error {
    return make_error(errc::invalid_argument,
                      "checkpoint name template \"" + std::string(text) + "\": " + why);
  };
  std::string literal;
  bool varying = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '}') {
      if (i + 1 < text.size() && text[i + 1] == '}') {
        literal += '}';
        ++i;
        continue;
      }
      return bad("a lone '}' (write '}}' for a brace)");
    }
    if (c != '{') {
      if (c == '/') return bad("a checkpoint name is one path component: no '/'");
      literal += c;
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '{') {
      literal += '{';
      ++i;
      continue;
    }
    const std::size_t close = text.find('}', i);
    if (close == std::string_view::npos) return bad("a '{' that is never closed");
    std::string_view spec = text.substr(i + 1, close - i - 1);
    std::string_view name = spec.substr(0, spec.find(':'));
    if (literal.empty() && !t.parts_.empty())
      return bad("two fields with nothing between them cannot be read back from a name");
    part p;
    p.literal = std::move(literal);
    literal.clear();
    if (!field_of(name, p.f)) {
      if (name == "rank")
        return bad(
            "{rank} would name a different checkpoint on every rank; every rank saves "
            "into the same one");
      return bad("unknown field {" + std::string(name) +
                 "} (known: step, epoch, batch, sample, token, world_size, tag)");
    }
    if (spec.size() > name.size()) {
      std::string_view fmt = spec.substr(name.size() + 1);
      if (!fmt.empty() && fmt.back() == 'd') fmt.remove_suffix(1);
      if (p.f == field::tag) return bad("{tag} takes no width");
      int width = 0;
      auto [end, ec] = std::from_chars(fmt.data(), fmt.data() + fmt.size(), width);
      if (fmt.empty() || ec != std::errc() || end != fmt.data() + fmt.size() || width < 0 ||
          width > 40)
        return bad("the width in {" + std::string(spec) + "} is not a number from 0 to 40");
      p.width = width;
    }
    varying = varying || p.f != field::world_size;
    t.parts_.push_back(std::move(p));
    i = close;
  }
  t.tail_ = std::move(literal);
  if (!varying) return bad("it names every checkpoint the same; use a field such as {step}");
  return t;
}

CAIRN_INLINE result<std::string> name_template::format(const checkpoint_counters& c,
                                                       int world_size) const {
  std::string out;
  for (const part& p : parts_) {
    out += p.literal;
    if (p.f == field::tag) {
      out += c.tag;
      continue;
    }
    std::int64_t v = value_of(p.f, c, world_size);
    std::string digits = std::to_string(v < 0 ? -v : v);
    if (v < 0) out += '-';
    const std::size_t width = static_cast<std::size_t>(p.width) - (v < 0 ? 1 : 0);
    if (p.width > 0 && digits.size() < width) out += std::string(width - digits.size(), '0');
    out += digits;
  }
  out += tail_;
  if (out.find('/') != std::string::npos || !object_name_problem(out).empty() || out.front() == '.')
    return make_error(errc::invalid_argument,
                      "checkpoint name \"" + out + "\" (from \"" + text_ +
                          "\") is not one path component, or starts with '.'");
  return out;
}

CAIRN_INLINE std::optional<checkpoint_counters> name_template::match(std::string_view name) const {
  checkpoint_counters c;
  std::optional<std::int64_t> world;
  if (!match_from(0, name, c, world)) return std::nullopt;
  return c;
}

CAIRN_INLINE bool name_template::has(field f) const noexcept {
  for (const part& p : parts_)
    if (p.f == f) return true;
  return false;
}

CAIRN_INLINE bool name_template::field_of(std::string_view name, field& f) {
  static constexpr std::pair<std::string_view, field> names[] = {
      {"step", field::step},     {"epoch", field::epoch}, {"batch", field::batch},
      {"sample", field::sample}, {"token", field::token}, {"world_size", field::world_size},
      {"tag", field::tag}};
  for (auto [n, v] : names)
    if (n == name) return f = v, true;
  return false;
}

CAIRN_INLINE std::int64_t name_template::value_of(field f,
                                                  const checkpoint_counters& c,
                                                  int world_size) {
  const std::int64_t* v = counter(f, c);
  return v ? *v : f == field::world_size ? world_size : 0;
}

CAIRN_INLINE bool name_template::match_from(std::size_t i,
                                            std::string_view rest,
                                            checkpoint_counters& c,
                                            std::optional<std::int64_t>& world) const {
  if (i == parts_.size()) return rest == tail_;
  const part& p = parts_[i];
  if (!rest.starts_with(p.literal)) return false;
  rest.remove_prefix(p.literal.size());
  if (p.f == field::tag) {
    for (std::size_t n = rest.size(); n >= 1; --n) {
      checkpoint_counters tried = c;
      tried.tag = std::string(rest.substr(0, n));
      if (match_from(i + 1, rest.substr(n), tried, world)) return c = std::move(tried), true;
    }
    return false;
  }
  std::size_t n = rest.starts_with('-') ? 1 : 0;
  while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + n, v);
  if (ec != std::errc() || end != rest.data() + n) return false;
  if (p.f == field::world_size) {
    if (world && *world != v) return false;
    world = v;
  } else {
    // The same field twice must hold the same value.
    for (std::size_t j = 0; j < i; ++j)
      if (parts_[j].f == p.f && value_of(p.f, c, 0) != v) return false;
    *counter(p.f, c) = v;
  }
  return match_from(i + 1, rest.substr(n), c, world);
}

}  // namespace cairn
