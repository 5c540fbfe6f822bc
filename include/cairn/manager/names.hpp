// cairn/manager/names.hpp: the counters a checkpoint is named by, and name templates
// ("step{step:08}", "ep{epoch}-ba{batch}", Composer's fields): validated once, formatted for
// every save, and matched back against the names found under a root.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
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
  static result<name_template> parse(std::string_view text);

  /// The name of the checkpoint at `c` on `world_size` ranks, or errc::invalid_argument when
  /// it is not a valid object name ("", ".", "..", a tag holding '/').
  result<std::string> format(const checkpoint_counters& c, int world_size) const;

  /// The counters `name` was formatted from (the fields the template has; the others zero), or
  /// nullopt when `name` is not of this template's form. Numbers are read as decimal integers
  /// (a zero-padded name matches back); `{tag}` matches any non-empty text.
  std::optional<checkpoint_counters> match(std::string_view name) const;

  /// Whether the template holds field `f`.
  bool has(field f) const noexcept;

  /// The template as given.
  const std::string& text() const noexcept { return text_; }

 private:
  struct part {
    std::string literal;  ///< text before the field
    field f = field::step;
    int width = 0;  ///< zero-padded to this many characters (0: as it is)
  };

  static bool field_of(std::string_view name, field& f);

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

  static std::int64_t value_of(field f, const checkpoint_counters& c, int world_size);

  /// Matches parts [i, end) and the tail against `rest` (backtracking over `{tag}`).
  bool match_from(std::size_t i,
                  std::string_view rest,
                  checkpoint_counters& c,
                  std::optional<std::int64_t>& world) const;

  std::string text_;
  std::vector<part> parts_;
  std::string tail_;  ///< text after the last field
};

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/manager/names-inl.hpp"
#endif
