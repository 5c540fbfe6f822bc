// tiny_trainer.hpp: the (tiny) tensor-parallel trainer shared by the train_resume examples.
//
// A linear model y = W x (W is [rows, cols], f32) trained with Adam. W and the Adam moments are
// split by rows across ranks (tensor parallel, uneven when rows % ranks != 0); the step counter
// and the hyper-parameters are common values. Rows are independent, so the result does not
// depend on how they are split: a run resumed on another number of ranks must end bit-equal to
// an uninterrupted one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"

namespace tiny {

constexpr std::int64_t rows = 24;  // output features (split over ranks)
constexpr std::int64_t cols = 16;  // input features
constexpr int batch = 8;

/// The rows of the weight matrix that rank `rank` of `world` owns: an even share, the first
/// rows % world ranks one row more (`cairn::even_split`), so any world size works.
inline cairn::even_part rows_of(int rank, int world) {
  return cairn::even_split(rows, rank, world);
}

/// Adam hyper-parameters: common values, identical on every rank.
struct adam_config {
  double lr = 0.05, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  static constexpr auto fields = cairn::field_names("lr", "beta1", "beta2", "eps");
};

/// Everything a rank checkpoints. The vectors own the memory; the sharded tensors view it
/// (their field names are "" so the buffers themselves are not part of the state).
struct train_state {
  std::vector<float> w_buf, m_buf, v_buf;
  cairn::sharded_tensor<float> weight, exp_avg, exp_avg_sq;
  std::int64_t step = 0;
  adam_config adam;
  cairn::local_non_persistent<std::vector<float>> grad;  // scratch, never saved
  static constexpr auto fields = cairn::field_names("",
                                                    "",
                                                    "",
                                                    "model.weight",
                                                    "optim.exp_avg",
                                                    "optim.exp_avg_sq",
                                                    "step",
                                                    "optim.adam",
                                                    "grad");
};

/// Allocates rank `rank`'s rows and describes them to cairn.
inline void init_state(train_state& s, int rank, int world) {
  cairn::even_part rb = rows_of(rank, world);
  for (auto* b : {&s.w_buf, &s.m_buf, &s.v_buf}) b->assign(rb.size * cols, 0.0f);
  s.grad.value.assign(rb.size * cols, 0.0f);
  auto view = [&](const char* key, std::vector<float>& buf) {
    return cairn::even_block(key, std::span(buf), {rows, cols}, 0, rank, world);
  };
  s.weight = view("model.weight", s.w_buf);
  s.exp_avg = view("optim.exp_avg", s.m_buf);
  s.exp_avg_sq = view("optim.exp_avg_sq", s.v_buf);
  for (std::int64_t r = 0; r < rb.size; ++r)  // deterministic init, independent of sharding
    for (std::int64_t c = 0; c < cols; ++c)
      s.w_buf[r * cols + c] = 0.01f * static_cast<float>((rb.offset + r) * 7 % 13) - 0.05f;
}

/// The target model the run learns, and the batch of step `s` (a pure function of the step,
/// so the data position is just the step counter).
inline float target_weight(std::int64_t r, std::int64_t c) { return std::sin(0.3f * r + 0.7f * c); }
inline float input(std::int64_t step, int b, std::int64_t c) {
  float t = static_cast<float>(step * batch + b);
  return std::sin(0.61f * t * static_cast<float>(c + 1) + 1.3f * static_cast<float>(c));
}

/// One Adam step on this rank's rows. Rows are independent, so the result does not depend on
/// how rows are split among ranks.
inline void train_step(train_state& s, int rank, int world) {
  cairn::even_part rb = rows_of(rank, world);
  std::vector<float>& g = s.grad.value;
  std::fill(g.begin(), g.end(), 0.0f);
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rb.size; ++r) {
      float pred = 0, want = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        float x = input(s.step, b, c);
        pred += s.w_buf[r * cols + c] * x;
        want += target_weight(rb.offset + r, c) * x;
      }
      float err = (pred - want) / batch;
      for (std::int64_t c = 0; c < cols; ++c) g[r * cols + c] += err * input(s.step, b, c);
    }
  }
  ++s.step;
  const adam_config& a = s.adam;
  double bc1 = 1 - std::pow(a.beta1, static_cast<double>(s.step));
  double bc2 = 1 - std::pow(a.beta2, static_cast<double>(s.step));
  for (std::size_t i = 0; i < g.size(); ++i) {
    s.m_buf[i] = static_cast<float>(a.beta1 * s.m_buf[i] + (1 - a.beta1) * g[i]);
    s.v_buf[i] = static_cast<float>(a.beta2 * s.v_buf[i] + (1 - a.beta2) * g[i] * g[i]);
    double update = a.lr * (s.m_buf[i] / bc1) / (std::sqrt(s.v_buf[i] / bc2) + a.eps);
    s.w_buf[i] = static_cast<float>(s.w_buf[i] - update);
  }
}

/// Mean squared prediction error of this rank's rows on the batch of step `step`.
inline float loss_of(const train_state& s, int rank, int world) {
  cairn::even_part rb = rows_of(rank, world);
  float l = 0;
  for (int b = 0; b < batch; ++b)
    for (std::int64_t r = 0; r < rb.size; ++r) {
      float d = 0;
      for (std::int64_t c = 0; c < cols; ++c)
        d += (s.w_buf[r * cols + c] - target_weight(rb.offset + r, c)) * input(s.step, b, c);
      l += d * d;
    }
  return l / static_cast<float>(batch * rb.size);
}

struct options {
  std::filesystem::path dir = "demo-ckpt";
  std::int64_t steps = 60, interrupt_at = 37, save_every = 10;
};

/// How the trainer checkpoints: every `save_every` steps into DIR/step_NNNNNN through one
/// `cairn::checkpointer` per rank, in the background (async), keeping the last two; `latest`
/// names the newest committed one.
inline cairn::checkpointer_options checkpointing(int world) {
  cairn::checkpointer_options c;
  c.name = "step_{step:06}";
  c.keep_last = 2;
  c.async = true;
  c.overwrite = true;  // re-running the demo replaces its own checkpoints
  c.save.content_metadata = {{"example", "train_resume"}, {"world_size", std::to_string(world)}};
  return c;
}

/// Trains on `comm`'s ranks until step `stop`: from the latest checkpoint in `o.dir` when
/// `resume` (from scratch otherwise), saving every `o.save_every` steps when `save_steps`; at
/// the end saves the weights to `final_dir` if given. A run that saves stops without
/// finalizing, its last save in flight: the checkpointer's destructor waits for it, committed
/// from the background thread (a job killed at that point resumes from the save before; the
/// crash trials of tests/system/crash check that).
inline void train(cairn::comm_ref comm,
                  const options& o,
                  std::int64_t stop,
                  bool save_steps,
                  bool resume,
                  const std::filesystem::path* final_dir,
                  const std::string& label) {
  const int rank = comm.rank(), world = comm.size();
  train_state s;
  init_state(s, rank, world);
  cairn::file_storage root(o.dir);
  cairn::checkpointer ckpt(root, comm, checkpointing(world));
  if (resume) {
    auto loaded = ckpt.load_latest(s).value();
    if (!loaded)
      throw cairn::exception(cairn::make_error(
          cairn::errc::not_found, "no checkpoint to resume from in " + o.dir.string()));
    if (rank == 0)
      std::printf("[%s] resumed from %s (step %lld) on %d ranks, %llu bytes read by rank 0\n",
                  label.c_str(), (o.dir / loaded->name).c_str(),
                  static_cast<long long>(loaded->counters.step), world,
                  static_cast<unsigned long long>(loaded->stats.bytes_read));
  }
  while (s.step < stop) {
    train_step(s, rank, world);
    if (save_steps && s.step % o.save_every == 0) {
      auto saved = ckpt.save(s, {.step = s.step});
      if (rank != 0) continue;
      std::printf("[%s] step %lld: saving %s in the background", label.c_str(),
                  static_cast<long long>(s.step), saved.name.c_str());
      if (saved.committed) {
        std::printf("; %s committed, latest -> %s", saved.committed->name.c_str(),
                    saved.committed->name.c_str());
        for (const auto& d : saved.committed->deleted) std::printf(", deleted %s", d.c_str());
      }
      std::printf("\n");
    }
  }
  if (final_dir) {
    cairn::file_storage disk(*final_dir);
    cairn::save_options so;
    so.overwrite = true;
    cairn::save(s, disk, comm, so);
  }
  if (rank == 0)
    std::printf("[%s] finished step %lld, rank 0 loss %.3g\n", label.c_str(),
                static_cast<long long>(s.step), loss_of(s, 0, world));
}

/// The checkpoint the `latest` pointer in `o.dir` names ("" when there is none).
inline std::string latest_checkpoint(const options& o) {
  cairn::file_storage root(o.dir);
  auto size = root.size("latest");
  if (!size) return {};
  std::string name(*size, '\0');
  if (!root.read("latest", 0, std::as_writable_bytes(std::span(name)))) return {};
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

/// Compares the final weights of a resumed run with the reference run and prints the line
/// "resume 4 -> N: match" (or MISMATCH with the largest difference). Returns true on match.
inline bool compare(const options& o, int from, int to) {
  auto load = [&](const std::string& name) {
    cairn::file_storage disk(o.dir / name);
    auto t = cairn::load_tensors(disk, {"model.weight"}).value();
    auto v = t.at("model.weight").as<float>();
    return std::vector<float>(v.begin(), v.end());
  };
  auto ref = load("final_reference");
  auto got = load("final_resume_" + std::to_string(to));
  float worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - got[i]));
  if (worst == 0) {
    std::printf("resume %d -> %d: match\n", from, to);
    return true;
  }
  std::printf("resume %d -> %d: MISMATCH (largest difference %g)\n", from, to, worst);
  return false;
}

/// Parses --dir, --steps, --interrupt-at, --save-every (and leaves other arguments in `rest`).
inline bool parse(int argc, char** argv, options& o, std::vector<std::string>& rest) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--dir" && has_value)
      o.dir = argv[++i];
    else if (a == "--steps" && has_value)
      o.steps = std::stoll(argv[++i]);
    else if (a == "--interrupt-at" && has_value)
      o.interrupt_at = std::stoll(argv[++i]);
    else if (a == "--save-every" && has_value)
      o.save_every = std::stoll(argv[++i]);
    else
      rest.push_back(a);
  }
  if (o.interrupt_at >= o.steps || o.interrupt_at < o.save_every) {
    std::fprintf(stderr, "need save-every <= interrupt-at < steps\n");
    return false;
  }
  return true;
}

}  // namespace tiny
