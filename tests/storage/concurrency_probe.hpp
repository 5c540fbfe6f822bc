// Helpers of the storage decorator tests: a clock reading and a backend that counts how many
// puts and writer calls run at the same time.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "cairn/storage/memory.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn_storage_test {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A backend for tests that counts how many puts and writer calls run at the same time (each
/// takes `hold`), forwarding to a memory_storage.
class concurrency_probe {
 public:
  explicit concurrency_probe(std::chrono::milliseconds hold) : hold_(hold) {}
  static constexpr cairn::storage_features features = cairn::memory_storage::features;

  int most_at_once() const { return most_.load(); }

  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    busy b(*this);
    return mem_.put(name, data);
  }
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, mem_.open_writer(name));
    return std::unique_ptr<cairn::object_writer>(std::make_unique<writer>(*this, std::move(w)));
  }
  cairn::result<void> read(std::string_view n, std::uint64_t o, std::span<std::byte> out) {
    return mem_.read(n, o, out);
  }
  cairn::result<std::uint64_t> size(std::string_view n) { return mem_.size(n); }
  cairn::result<bool> exists(std::string_view n) { return mem_.exists(n); }
  cairn::result<std::vector<std::string>> list(std::string_view p) { return mem_.list(p); }
  cairn::result<void> remove(std::string_view n) { return mem_.remove(n); }
  std::string describe(std::string_view n) const { return mem_.describe(n); }

 private:
  struct busy {
    concurrency_probe& p;
    explicit busy(concurrency_probe& probe) : p(probe) {
      int now = ++p.in_flight_;
      int most = p.most_.load();
      while (now > most && !p.most_.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(p.hold_);
    }
    ~busy() { --p.in_flight_; }
  };
  class writer final : public cairn::object_writer {
   public:
    writer(concurrency_probe& p, std::unique_ptr<cairn::object_writer> w)
        : p_(p), w_(std::move(w)) {}
    cairn::result<void> write_at(std::uint64_t o, std::span<const std::byte> d) override {
      busy b(p_);
      return w_->write_at(o, d);
    }
    cairn::result<void> finish() override {
      busy b(p_);
      return w_->finish();
    }

   private:
    concurrency_probe& p_;
    std::unique_ptr<cairn::object_writer> w_;
  };

  std::chrono::milliseconds hold_;
  cairn::memory_storage mem_;
  std::atomic<int> in_flight_{0}, most_{0};
};
static_assert(cairn::storage<concurrency_probe>);

}  // namespace cairn_storage_test
