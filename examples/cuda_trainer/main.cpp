// examples/cuda_trainer/main.cpp: a CUDA trainer's cairn side. The weights live in device
// memory (kernels.cu trains them) and the state tree points straight at them: a
// cairn::checkpointer saves every few steps in the background (training stalls only while the
// weights are copied into its pinned staging pool), keeps the last two checkpoints and moves
// DIR/latest once each commits (from its background thread); after the run stops with a save in
// flight (which the checkpointer finishes as it closes), a new checkpointer resumes with
// load_latest, which loads through the pool and copies back into device memory. Without a usable
// GPU the weights live in host memory and the same calls take the host path (it says so once).
//
//   cuda_trainer [--dir DIR]     prints "resume: match" and exits 0, or MISMATCH and exits 1
#include <cairn/cairn.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace {

constexpr int rows = 256, cols = 1024;
constexpr std::size_t weight_bytes = sizeof(float) * rows * cols;

// What the checkpoint holds: two weight matrices and the step.
struct model_state {
  cairn::sharded_tensor<float> w1;
  cairn::sharded_tensor<float> w2;
  std::int64_t step = 0;
  static constexpr auto fields = cairn::field_names("w1", "w2", "step");
};

// One weight tensor, in device memory when a device is usable, else in host memory.
struct weight {
  float* data = nullptr;
  std::vector<float> host;  // the fallback storage
  bool on_device = false;

  weight(bool use_device, int k) {
    std::vector<float> init(rows * cols);
    for (std::size_t i = 0; i < init.size(); ++i)
      init[i] = static_cast<float>(k + 1) * 0.001f * static_cast<float>(i % 97);
    if (use_device) {
      data = static_cast<float*>(trainer::device_alloc(weight_bytes));
      if (!data || !trainer::upload(data, init.data(), weight_bytes))
        throw std::runtime_error("device allocation failed");
      on_device = true;
    } else {
      host = std::move(init);
      data = host.data();
    }
  }
  weight(const weight&) = delete;
  weight& operator=(const weight&) = delete;
  ~weight() {
    if (on_device) trainer::device_free(data);
  }

  // One "optimizer step".
  void step(int step) {
    constexpr float lr = 0.01f;
    if (on_device) {
      if (!trainer::sgd_step(data, rows * cols, lr, step))
        throw std::runtime_error("kernel failed");
      return;
    }
    for (int i = 0; i < rows * cols; ++i)
      data[i] -= lr * std::sin(0.001f * static_cast<float>(i) + static_cast<float>(step));
  }

  // A host copy of the values (to compare after the resume).
  std::vector<float> values() const {
    if (!on_device) return host;
    std::vector<float> out(rows * cols);
    if (!trainer::download(out.data(), data, weight_bytes))
      throw std::runtime_error("device copy failed");
    return out;
  }
};

// The state tree over the weights, wherever they live: cairn stages device memory itself.
model_state state_of(weight& a, weight& b) {
  model_state m;
  m.w1 =
      cairn::block<float>("w1", std::span(a.data, rows * cols), {rows, cols}, {rows, cols}, {0, 0});
  m.w2 =
      cairn::block<float>("w2", std::span(b.data, rows * cols), {rows, cols}, {rows, cols}, {0, 0});
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "cairn_cuda_trainer";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cuda_trainer [--dir DIR]\n");
      return 2;
    }
  }
  try {
    const auto& dev = cairn::cuda::system_device();  // probed once; never prints by itself
    const bool use_device = dev.usable && trainer::device_count() > 0;
    if (use_device)
      std::printf("device: %d CUDA device(s); weights in device memory\n", dev.count);
    else
      std::printf("device: none (%s); falling back to host memory\n", dev.reason.c_str());
    std::filesystem::remove_all(dir);
    cairn::single_communicator comm;
    // Async saves; the last two kept; DIR/latest moved after each commit.
    const cairn::checkpointer_options opt{.name = "step{step:04}", .keep_last = 2, .async = true};

    weight w1(use_device, 0), w2(use_device, 1);
    model_state state = state_of(w1, w2);
    std::vector<float> at_15[2];
    {  // The first run: saves at steps 5, 10 and 15, then stops with the last save in flight.
      cairn::checkpointer ckpt(dir.string(), comm, opt);
      for (int step = 0; step < 15; ++step) {
        w1.step(step);
        w2.step(step);
        if ((step + 1) % 5 != 0) continue;
        state.step = step + 1;
        auto t0 = std::chrono::steady_clock::now();
        auto saved = ckpt.save(state, {.step = step + 1});  // returns once the weights are staged
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
        std::printf("save %s: training stalled %.1f ms (%zu bytes staged)%s%s\n",
                    saved.name.c_str(), ms, 2 * weight_bytes, saved.committed ? "; committed " : "",
                    saved.committed ? saved.committed->name.c_str() : "");
        if (step + 1 == 15) at_15[0] = w1.values(), at_15[1] = w2.values();
      }
      w1.step(15);  // training goes on: the checkpoint holds the values staged at step 15
      w2.step(15);
      std::printf("stop: the save of step 15 is in flight; the checkpointer finishes it\n");
    }  // the checkpointer closes without finalize(): it waits for the save, committed

    // The second run: fresh weights, then resume from the newest committed checkpoint.
    weight r1(use_device, 7), r2(use_device, 8);
    model_state resumed = state_of(r1, r2);
    cairn::checkpointer ckpt(dir.string(), comm, opt);
    auto loaded = ckpt.load_latest(resumed).value();
    if (!loaded) {
      std::printf("resume: MISMATCH (no checkpoint found)\n");
      return 1;
    }
    const bool match = loaded->name == "step0015" && resumed.step == 15 &&
                       r1.values() == at_15[0] && r2.values() == at_15[1];
    std::printf("resume: %s (%s, step %lld)\n", match ? "match" : "MISMATCH", loaded->name.c_str(),
                static_cast<long long>(resumed.step));
    return match ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_trainer: %s\n", e.what());
    return 1;
  }
}
