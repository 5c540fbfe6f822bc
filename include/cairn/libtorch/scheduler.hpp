// cairn/libtorch/scheduler.hpp: libtorch learning-rate schedulers in a state tree (target
// cairn::torch), as ColossalAI and DeepSpeed save `lr_scheduler` beside model and optimizer.
//
//     cairn::libtorch::saved_scheduler<torch::optim::StepLR> sched(opt, 3, 0.5);
//     state.add("sched", cairn::libtorch::scheduler_state(sched));
//
// A libtorch `LRScheduler` keeps one piece of state of its own, its step count (protected
// `step_count_`); the learning rates it set live in the optimizer's groups, which
// `optimizer_state` saves as `param_groups.<i>.lr`. Saving both resumes the schedule exactly.
#pragma once

#include <torch/optim/schedulers/lr_scheduler.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <string>

#include "cairn/core/common_value.hpp"
#include "cairn/core/error.hpp"
#include "cairn/libtorch/optim.hpp"

namespace cairn::libtorch {

/// A libtorch scheduler `S` (StepLR, or your own `LRScheduler` subclass) whose step count
/// cairn can read and set: constructed as `S` is.
template <class S>
requires std::derived_from<S, ::torch::optim::LRScheduler>
class saved_scheduler : public S {
 public:
  using S::S;
  /// How many times `step()` has run (libtorch's `step_count_`).
  unsigned step_count() const noexcept { return this->step_count_; }
  /// Sets the step count, as a resumed schedule needs it.
  void set_step_count(unsigned n) noexcept { this->step_count_ = n; }
};

/// The state of `sched` as a tree: its step count as the common value `step_count`. Loading
/// sets it; a saved count that does not fit `unsigned` fails naming the key.
template <class S>
factory scheduler_state(saved_scheduler<S>& sched) {
  factory f;
  f.build = [&sched] {
    state_dict d;
    d.add("step_count",
          detail::common_factory(
              [&sched] { return common_value::of(static_cast<std::int64_t>(sched.step_count())); },
              [&sched](const common_value& c) -> result<void> {
                std::int64_t n = 0;
                CAIRN_TRY(c.get(n));
                if (n < 0 || n > std::numeric_limits<unsigned>::max())
                  return make_error(errc::mismatch, "a scheduler step count of " +
                                                        std::to_string(n) + " does not fit")
                      .with_key("step_count");
                sched.set_step_count(static_cast<unsigned>(n));
                return ok();
              }));
    return d;
  };
  return f;
}

}  // namespace cairn::libtorch
