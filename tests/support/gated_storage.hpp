// tests/support/gated_storage.hpp: a storage decorator that holds every write until the test
// opens it, so that a test acts while background writes are known to be waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string_view>
#include <thread>

#include "cairn/storage/decorator.hpp"

namespace cairn_test {

/// Holds every write (put, open_writer) through it until `open()`, counting the calls that
/// arrived.
template <class Backend>
class gated_storage : public cairn::storage_decorator<Backend> {
 public:
  using decorator = cairn::storage_decorator<Backend>;
  explicit gated_storage(Backend& b) : decorator(b) {}
  /// Write calls that reached the gate so far.
  std::atomic<int> arrived{0};
  /// Lets every held and later write through.
  void open() { open_.store(true); }
  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    pass();
    return decorator::put(name, data);
  }
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    pass();
    return decorator::open_writer(name);
  }

 private:
  void pass() {
    ++arrived;
    while (!open_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> open_{false};
};

}  // namespace cairn_test
