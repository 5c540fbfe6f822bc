// A pipeline-parallel state for tests: each stage's ranks hold its layers' weights and declare
// their optimizer steps as common values held by the stage (a group of ranks), every rank the
// iteration; loaded on any (pipeline, data-parallel) layout and compared with what was saved.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "cairn/cairn.hpp"

namespace cairn_test {

/// Layers of the model the pipeline splits.
inline constexpr int pipeline_layers = 4;

/// One rank of a pipeline (`pp` stages) × data-parallel (`dp` replicas) job over
/// `pipeline_layers` layers, stage-major (rank = stage * dp + replica): the rank's stage holds
/// layers [stage * L / pp, (stage + 1) * L / pp), each a weight "layers.<l>.w" (f32 [3],
/// replicated over the stage's replicas) and an optimizer step "optim.layers.<l>.step" (a
/// common value only the stage's ranks declare); every rank declares "iteration".
struct pipeline_rank {
  std::vector<std::vector<float>> w;
  std::vector<int> layers;
  cairn::state_dict sd;

  pipeline_rank(int rank, int pp, int dp, std::int64_t base) {
    const int stage = rank / dp, per_stage = pipeline_layers / pp;
    for (int l = stage * per_stage; l < (stage + 1) * per_stage; ++l) layers.push_back(l);
    w.resize(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      w[i] = {static_cast<float>(base + l), static_cast<float>(base + l) + 0.5f,
              static_cast<float>(-l)};
      const std::string key = "layers." + std::to_string(l) + ".w";
      sd.add(key, cairn::replicated(key, std::span(w[i]), {3}, rank % dp));
      sd.add(step_key(l), std::int64_t{base + 100 * l});
    }
    sd.add("iteration", std::int64_t{base});
  }

  static std::string step_key(int l) { return "optim.layers." + std::to_string(l) + ".step"; }

  /// The common value at `name`.
  std::int64_t value(const std::string& name) const {
    return std::get<cairn::common_value>(*sd.find(name)).as<std::int64_t>();
  }

  /// Adds `delta` to layer `l`'s step.
  void bump_step(int l, std::int64_t delta) {
    sd.add(step_key(l), std::int64_t{value(step_key(l)) + delta});
  }

  /// Sets every value to garbage, for a load to overwrite.
  void scramble() {
    for (auto& v : w) std::fill(v.begin(), v.end(), -99.0f);
    for (int l : layers) sd.add(step_key(l), std::int64_t{-1});
    sd.add("iteration", std::int64_t{-1});
  }

  /// What differs from the values a save with `base` held.
  std::vector<std::string> differences(std::int64_t base) const {
    std::vector<std::string> out;
    if (value("iteration") != base)
      out.push_back("iteration " + std::to_string(value("iteration")));
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const int l = layers[i];
      if (value(step_key(l)) != base + 100 * l)
        out.push_back("layer " + std::to_string(l) + " step " + std::to_string(value(step_key(l))));
      if (w[i][0] != static_cast<float>(base + l) || w[i][2] != static_cast<float>(-l))
        out.push_back("layer " + std::to_string(l) + " weight");
    }
    return out;
  }
};

}  // namespace cairn_test
