// examples/cuda_trainer/main.cpp: a CUDA trainer's cairn side. Weights live in device memory
// (kernels.cu trains them); a save stages them into cairn's pinned staging pool with
// cudaMemcpyAsync and writes the staged copy; a resume loads into the pool and copies back to
// the device. Without a usable GPU the weights live in host memory and the same cairn calls
// take the host path (it says so once).
//
//   cuda_trainer [--dir DIR]     prints "resume: match" and exits 0, or MISMATCH and exits 1
#include <cairn/cairn.hpp>
#include <cairn/cuda/staging_pool.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace {

constexpr int rows = 256, cols = 1024;

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
};

bool step_weight(weight& w, int step) {
  constexpr float lr = 0.01f;
  if (w.on_device) return trainer::sgd_step(w.data, rows * cols, lr, step);
  for (int i = 0; i < rows * cols; ++i)
    w.data[i] -= lr * std::sin(0.001f * static_cast<float>(i) + static_cast<float>(step));
  return true;
}

// The state over pool spans (host memory): what cairn saves from and loads into.
model_state over(std::span<std::byte> a, std::span<std::byte> b, std::int64_t step) {
  auto as_floats = [](std::span<std::byte> s) {
    return std::span<float>(reinterpret_cast<float*>(s.data()), s.size() / sizeof(float));
  };
  model_state m;
  m.w1 = cairn::block<float>("w1", as_floats(a), {rows, cols}, {rows, cols}, {0, 0});
  m.w2 = cairn::block<float>("w2", as_floats(b), {rows, cols}, {rows, cols}, {0, 0});
  m.step = step;
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

    const std::size_t bytes = sizeof(float) * rows * cols;
    weight w[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<float> init(rows * cols);
      for (std::size_t i = 0; i < init.size(); ++i)
        init[i] = static_cast<float>(k + 1) * 0.001f * static_cast<float>(i % 97);
      if (use_device) {
        w[k].data = static_cast<float*>(trainer::device_alloc(bytes));
        if (!w[k].data || !trainer::upload(w[k].data, init.data(), bytes)) {
          std::fprintf(stderr, "cuda_trainer: device allocation failed\n");
          return 1;
        }
        w[k].on_device = true;
      } else {
        w[k].host = std::move(init);
        w[k].data = w[k].host.data();
      }
    }

    // Allocated once (pinned when a device is usable), pre-touched, reused by every save.
    cairn::cuda::staging_pool pool;
    cairn::cuda::stager stager(pool, {.threads = 2});
    std::printf("staging: %s\n", pool.describe().c_str());
    cairn::single_communicator comm;
    std::filesystem::remove_all(dir);

    std::vector<std::byte> saved[2];
    std::int64_t step = 0;
    for (; step < 10; ++step)
      for (auto& x : w)
        if (!step_weight(x, static_cast<int>(step))) return 1;

    {  // save at step 10: stage (device -> pinned host), wait, write the staged copy
      cairn::cuda::stage_item items[] = {{w[0].data, bytes, "w1"}, {w[1].data, bytes, "w2"}};
      auto staged = stager.stage(items).value();
      stager.wait().value();  // from here training may change the device tensors again
      for (int k = 0; k < 2; ++k) saved[k].assign(staged[k].begin(), staged[k].end());
      cairn::file_storage disk(dir / "step_10");
      cairn::save(over(staged[0], staged[1], step), disk, comm);
      pool.reset();  // the save's writes are done: the pool is free for the next one
      std::printf("saved step %lld (%zu bytes staged)\n", static_cast<long long>(step), 2 * bytes);
    }

    for (; step < 15; ++step)  // training goes on, then "crashes"
      for (auto& x : w)
        if (!step_weight(x, static_cast<int>(step))) return 1;

    {  // resume: load into the pool, then copy into the weights (host -> device)
      auto a = pool.acquire(bytes).value();
      auto b = pool.acquire(bytes).value();
      model_state m = over(a, b, 0);
      cairn::file_storage disk(dir / "step_10");
      cairn::load(m, disk, comm);
      cairn::cuda::unstage_item items[] = {{w[0].data, a.data(), bytes, "w1"},
                                           {w[1].data, b.data(), bytes, "w2"}};
      stager.unstage(items).value();
      stager.wait().value();
      step = m.step;
      pool.reset();
    }

    // Stage again to read the weights back and compare with what was saved.
    cairn::cuda::stage_item items[] = {{w[0].data, bytes, "w1"}, {w[1].data, bytes, "w2"}};
    auto check = stager.stage(items).value();
    stager.wait().value();
    bool match = step == 10;
    for (int k = 0; k < 2; ++k)
      match = match && std::memcmp(check[k].data(), saved[k].data(), bytes) == 0;
    std::printf("resume: %s (step %lld)\n", match ? "match" : "MISMATCH",
                static_cast<long long>(step));
    for (auto& x : w)
      if (x.on_device) trainer::device_free(x.data);
    return match ? 0 : 1;
  } catch (const cairn::exception& e) {
    std::fprintf(stderr, "cuda_trainer: %s\n", e.what());
    return 1;
  }
}
