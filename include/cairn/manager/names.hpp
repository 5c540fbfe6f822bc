// cairn/manager/names.hpp: the counters a checkpoint is named by, and name templates
// ("step{step:08}", "ep{epoch}-ba{batch}", Composer's fields): validated once, formatted for
// every save, and matched back against the names found under a root.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/names.hpp"

namespace cairn {

/// Where training is: what a checkpoint is named by (see `name_template`) and what is saved
/// with it and returned by `checkpointer::load_latest`.
struct checkpoint_counters {
  std::int64_t step = 0;    ///< optimizer steps taken ({step})
  std::int64_t epoch = 0;   ///< epochs completed ({epoch})
  std::int64_t batch = 0;   ///< batches taken ({batch})
  std::int64_t sample = 0;  ///< samples seen ({sample})
  std::int64_t token = 0;   ///< tokens seen ({token})
  std::string tag;          ///< a free-form label ({tag}), e.g. DeepSpeed's "global_step100"

  friend bool operator==(const checkpoint_counters&, const checkpoint_counters&) = default;
};

/// A checkpoint name template: literal text and fields in braces, `{step}`, `{epoch}`,
/// `{batch}`, `{sample}`, `{token}`, `{world_size}` and `{tag}`, a number optionally zero-padded
/// (`{step:08}` or `{step:08d}`), `{{` and `}}` for braces. A name is one path component (no
/// '/'), the same on every rank: `{rank}` is refused, since every rank writes into the one
/// checkpoint. At least one field must vary from save to save.
class name_template {
 public:
  /// The fields a template may use.
  enum class field { step, epoch, batch, sample, token, world_size, tag };

  /// Parses `text`, or errc::invalid_argument saying what is wrong with it.
  static result<name_template> parse(std::string_view text) {
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

  /// The name of the checkpoint at `c` on `world_size` ranks, or errc::invalid_argument when
  /// it is not a valid object name ("", ".", "..", a tag holding '/').
  result<std::string> format(const checkpoint_counters& c, int world_size) const {
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
    if (out.find('/') != std::string::npos || !object_name_problem(out).empty() ||
        out.front() == '.')
      return make_error(errc::invalid_argument,
                        "checkpoint name \"" + out + "\" (from \"" + text_ +
                            "\") is not one path component, or starts with '.'");
    return out;
  }

  /// The counters `name` was formatted from (the fields the template has; the others zero), or
  /// nullopt when `name` is not of this template's form. Numbers are read as decimal integers
  /// (a zero-padded name matches back); `{tag}` matches any non-empty text.
  std::optional<checkpoint_counters> match(std::string_view name) const {
    checkpoint_counters c;
    std::optional<std::int64_t> world;
    if (!match_from(0, name, c, world)) return std::nullopt;
    return c;
  }

  /// Whether the template holds field `f`.
  bool has(field f) const noexcept {
    for (const part& p : parts_)
      if (p.f == f) return true;
    return false;
  }

  /// The template as given.
  const std::string& text() const noexcept { return text_; }

 private:
  struct part {
    std::string literal;  ///< text before the field
    field f = field::step;
    int width = 0;  ///< zero-padded to this many characters (0: as it is)
  };

  static bool field_of(std::string_view name, field& f) {
    static constexpr std::pair<std::string_view, field> names[] = {
        {"step", field::step},     {"epoch", field::epoch}, {"batch", field::batch},
        {"sample", field::sample}, {"token", field::token}, {"world_size", field::world_size},
        {"tag", field::tag}};
    for (auto [n, v] : names)
      if (n == name) return f = v, true;
    return false;
  }

  /// The counter field `f` names in `c` (const or not); null for `{world_size}` and `{tag}`.
  template <class Counters>
  static auto counter(field f, Counters& c) -> decltype(&c.step) {
    switch (f) {
      case field::step:
        return &c.step;
      case field::epoch:
        return &c.epoch;
      case field::batch:
        return &c.batch;
      case field::sample:
        return &c.sample;
      case field::token:
        return &c.token;
      case field::world_size:
      case field::tag:
        return nullptr;
    }
    return nullptr;
  }

  static std::int64_t value_of(field f, const checkpoint_counters& c, int world_size) {
    const std::int64_t* v = counter(f, c);
    return v ? *v : f == field::world_size ? world_size : 0;
  }

  /// Matches parts [i, end) and the tail against `rest` (backtracking over `{tag}`).
  bool match_from(std::size_t i,
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

  std::string text_;
  std::vector<part> parts_;
  std::string tail_;  ///< text after the last field
};

}  // namespace cairn
