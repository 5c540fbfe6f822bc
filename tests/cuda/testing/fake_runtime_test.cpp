// tests/cuda/testing/fake_runtime_test.cpp: cairn/cuda/testing/fake_runtime.hpp, the test
// double the staging tests trust: device memory reachable only through copies and the test
// helpers (bounds included), copies deferred until an event or stream is synchronized, in stream
// order and per stream, every kind of misuse refused with code 1 and recorded, fault injection,
// and counters. (The basics of a copy round trip are in tests/cuda/runtime_test.cpp.)
#include "cairn/cuda/testing/fake_runtime.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cairn/cuda/runtime.hpp"

namespace fake_runtime_test {

namespace cc = cairn::cuda;
using fake = cairn::cuda::testing::fake_runtime;

inline std::vector<std::byte> filled(std::size_t n, int v) {
  return std::vector<std::byte>(n, static_cast<std::byte>(v));
}

/// A stream and an event of `f`, destroyed at scope exit.
struct stream_and_event {
  const cc::runtime_api& rt;
  cc::stream_t s = nullptr;
  cc::event_t e = nullptr;
  explicit stream_and_event(const fake& f) : rt(f.api()) {
    REQUIRE(rt.stream_create(rt.self, &s) == 0);
    REQUIRE(rt.event_create(rt.self, &e) == 0);
  }
  ~stream_and_event() {
    rt.event_destroy(rt.self, e);
    rt.stream_destroy(rt.self, s);
  }
};

}  // namespace fake_runtime_test

TEST_CASE("fake device memory: the test helpers stay inside an allocation") {
  fake_runtime_test::fake f;
  void* dev = f.device_malloc(10);
  auto* d = static_cast<std::byte*>(dev);
  const auto src = fake_runtime_test::filled(10, 7);
  f.device_write(dev, src.data(), 10);
  CHECK(f.device_read(dev, 10) == src);
  CHECK(f.device_read(d + 4, 6) == fake_runtime_test::filled(6, 7));
  CHECK(f.device_read(d + 10, 0).empty());                           // the end, empty
  CHECK_THROWS_AS(f.device_read(d + 4, 7), std::invalid_argument);   // one byte past
  CHECK_THROWS_AS(f.device_read(d + 11, 0), std::invalid_argument);  // reserved, not allocated
  CHECK_THROWS_AS(f.device_write(d + 9, src.data(), 2), std::invalid_argument);
  CHECK_THROWS_AS(f.device_read(src.data(), 1), std::invalid_argument);  // host memory

  // The whole reserved page is "device" to pointer queries; pinned memory is host memory.
  const auto& rt = f.api();
  cc::memory_type t{};
  int dev_id = -1;
  CHECK(rt.pointer_get_attributes(rt.self, d + 4000, &t, &dev_id) == 0);
  CHECK(t == cc::memory_type::device);
  CHECK(dev_id == 0);
  void* pinned = nullptr;
  REQUIRE(rt.host_alloc(rt.self, &pinned, 64) == 0);
  CHECK(rt.pointer_get_attributes(rt.self, static_cast<char*>(pinned) + 63, &t, &dev_id) == 0);
  CHECK(t == cc::memory_type::host);
  CHECK(rt.pointer_get_attributes(rt.self, static_cast<char*>(pinned) + 64, &t, &dev_id) == 0);
  CHECK(t == cc::memory_type::unregistered);
  CHECK(dev_id == -1);
  CHECK(f.live_pinned() == 1);
  CHECK(rt.free_host(rt.self, pinned) == 0);
  CHECK(f.live_pinned() == 0);

  f.device_free(dev);
  CHECK(f.misuse().empty());
  f.device_free(dev);  // twice
  CHECK(f.misuse() == std::vector<std::string>{"device_free of an unknown pointer"});
}

TEST_CASE("fake copies run in stream order, up to the synchronized event, per stream") {
  fake_runtime_test::fake f;
  const auto& rt = f.api();
  void* dev = f.device_malloc(8);
  fake_runtime_test::stream_and_event a(f), b(f);
  cc::event_t later = nullptr;
  REQUIRE(rt.event_create(rt.self, &later) == 0);
  const auto one = fake_runtime_test::filled(8, 1), two = fake_runtime_test::filled(8, 2);
  std::vector<std::byte> back_a(8), back_b(8);
  REQUIRE(rt.memcpy_async(rt.self, dev, one.data(), 8, cc::copy_kind::host_to_device, a.s) == 0);
  REQUIRE(rt.event_record(rt.self, a.e, a.s) == 0);
  REQUIRE(rt.memcpy_async(rt.self, dev, two.data(), 8, cc::copy_kind::host_to_device, a.s) == 0);
  REQUIRE(rt.event_record(rt.self, later, a.s) == 0);
  REQUIRE(rt.memcpy_async(rt.self, back_b.data(), dev, 8, cc::copy_kind::device_to_host, b.s) == 0);
  CHECK(f.pending_copies() == 3);

  REQUIRE(rt.event_synchronize(rt.self, a.e) == 0);  // the first copy only
  CHECK(f.device_read(dev, 8) == one);
  CHECK(f.pending_copies() == 2);
  REQUIRE(rt.stream_synchronize(rt.self, b.s) == 0);  // stream b alone: sees the first copy
  CHECK(back_b == one);
  CHECK(f.pending_copies() == 1);
  REQUIRE(rt.stream_wait_event(rt.self, b.s, later) == 0);  // b waits for a's second copy
  CHECK(f.device_read(dev, 8) == two);
  CHECK(f.pending_copies() == 0);

  // Destroying a stream completes its work; drain() completes everyone's.
  REQUIRE(rt.memcpy_async(rt.self, back_a.data(), dev, 8, cc::copy_kind::automatic, a.s) == 0);
  REQUIRE(rt.memcpy_async(rt.self, back_b.data(), dev, 8, cc::copy_kind::automatic, b.s) == 0);
  f.drain();
  CHECK(back_a == two);
  CHECK(back_b == two);
  REQUIRE(rt.event_destroy(rt.self, later) == 0);

  auto st = f.stats();
  CHECK(st.memcpy_calls == 5);
  CHECK(st.h2d == 2);
  CHECK(st.d2h == 3);  // automatic resolves to device_to_host
  CHECK(st.bytes == 40);
  CHECK(st.synchronizes == 2);  // stream_wait_event is not a host synchronization
  CHECK(f.misuse().empty());
  f.device_free(dev);
}

TEST_CASE("a fake event recorded twice is complete only when its latest record is") {
  // cudaEventSynchronize waits for the most recent cudaEventRecord: reusing one event per
  // buffer, as staging does, must not return while the newer copy is still pending.
  fake_runtime_test::fake f;
  const auto& rt = f.api();
  void* dev = f.device_malloc(4);
  fake_runtime_test::stream_and_event se(f);
  const auto one = fake_runtime_test::filled(4, 1), two = fake_runtime_test::filled(4, 2);
  REQUIRE(rt.memcpy_async(rt.self, dev, one.data(), 4, cc::copy_kind::host_to_device, se.s) == 0);
  REQUIRE(rt.event_record(rt.self, se.e, se.s) == 0);
  REQUIRE(rt.memcpy_async(rt.self, dev, two.data(), 4, cc::copy_kind::host_to_device, se.s) == 0);
  REQUIRE(rt.event_record(rt.self, se.e, se.s) == 0);
  REQUIRE(rt.event_synchronize(rt.self, se.e) == 0);
  CHECK(f.device_read(dev, 4) == two);
  CHECK(f.pending_copies() == 0);

  // Re-recorded on another stream: the old stream's queue no longer matters.
  fake_runtime_test::stream_and_event other(f);
  const auto three = fake_runtime_test::filled(4, 3);
  REQUIRE(rt.memcpy_async(rt.self, dev, three.data(), 4, cc::copy_kind::host_to_device, se.s) == 0);
  REQUIRE(rt.event_record(rt.self, se.e, se.s) == 0);
  REQUIRE(rt.event_record(rt.self, se.e, other.s) == 0);
  REQUIRE(rt.event_synchronize(rt.self, se.e) == 0);
  CHECK(f.pending_copies() == 1);  // the copy on se.s was not waited for
  f.device_free(dev);
  f.drain();
}

TEST_CASE("fake runtime misuse returns 1 and is recorded, never counted as work") {
  fake_runtime_test::fake f;
  const auto& rt = f.api();
  void* dev = f.device_malloc(16);
  std::vector<std::byte> host(16);
  auto* unknown_stream = reinterpret_cast<cc::stream_t>(std::uintptr_t{0xdead});
  auto* unknown_event = reinterpret_cast<cc::event_t>(std::uintptr_t{0xbeef});
  fake_runtime_test::stream_and_event se(f);
  CHECK(rt.memcpy_async(rt.self, dev, host.data(), 16, cc::copy_kind::host_to_device,
                        unknown_stream) == 1);
  CHECK(rt.memcpy_async(rt.self, dev, host.data(), 16, cc::copy_kind::device_to_host, se.s) == 1);
  CHECK(rt.memcpy_async(rt.self, dev, host.data(), 17, cc::copy_kind::host_to_device, se.s) == 1);
  CHECK(rt.event_record(rt.self, unknown_event, se.s) == 1);
  CHECK(rt.event_record(rt.self, se.e, unknown_stream) == 1);
  CHECK(rt.event_synchronize(rt.self, unknown_event) == 1);
  CHECK(rt.event_destroy(rt.self, unknown_event) == 1);
  CHECK(rt.stream_synchronize(rt.self, unknown_stream) == 1);
  CHECK(rt.stream_wait_event(rt.self, unknown_stream, se.e) == 1);
  CHECK(rt.stream_wait_event(rt.self, se.s, unknown_event) == 1);
  CHECK(rt.stream_destroy(rt.self, nullptr) == 1);  // the legacy default stream
  CHECK(rt.free_host(rt.self, host.data()) == 1);
  CHECK(rt.host_register(rt.self, static_cast<char*>(dev) + 8, 4) == 1);
  CHECK(rt.host_unregister(rt.self, host.data()) == 1);
  auto m = f.misuse();
  REQUIRE(m.size() == 14);
  CHECK(m[0] == "cudaMemcpyAsync on an unknown stream");
  CHECK(m[1] ==
        "cudaMemcpyAsync: copy kind 2 does not match the pointers (source on device: no, "
        "destination on device: yes)");
  CHECK(m[2] == "cudaMemcpyAsync: 17 bytes run past the end of a device allocation");
  CHECK(m[10] == "cudaStreamDestroy of an unknown stream");
  CHECK(m[12] == "cudaHostRegister of device memory");
  CHECK(f.stats().memcpy_calls == 0);
  CHECK(f.stats().bytes == 0);
  CHECK(f.stats().synchronizes == 0);

  // Registered host memory unregisters once.
  CHECK(rt.host_register(rt.self, host.data(), 16) == 0);
  CHECK(rt.host_unregister(rt.self, host.data()) == 0);
  CHECK(rt.host_unregister(rt.self, host.data()) == 1);

  // A copy whose device memory is freed before it runs is reported when it would have run.
  REQUIRE(rt.memcpy_async(rt.self, dev, host.data(), 16, cc::copy_kind::host_to_device, se.s) == 0);
  f.device_free(dev);
  CHECK(rt.stream_synchronize(rt.self, se.s) == 0);
  CHECK(f.misuse().back() == "a queued copy's device memory was freed before it ran");
}

TEST_CASE("fake runtime fault injection") {
  SUBCASE("devices and drivers") {
    fake_runtime_test::fake two(2), none(0), broken;
    broken.fail_device_count(35);
    int n = -1;
    CHECK(two.api().get_device_count(two.api().self, &n) == 0);
    CHECK(n == 2);
    CHECK(none.api().get_device_count(none.api().self, &n) == 100);
    CHECK(n == 0);
    CHECK(broken.api().get_device_count(broken.api().self, &n) == 35);
    CHECK(n == 0);
    broken.fail_device_count(0);
    CHECK(broken.api().get_device_count(broken.api().self, &n) == 0);
    CHECK(broken.stats().device_count_calls == 2);
    CHECK(cc::describe_status(broken.api(), "cudaMalloc", 700) ==
          "cudaMalloc: an illegal memory access was encountered (code 700)");
    CHECK(std::string(fake_runtime_test::fake::error_string(12345)) == "unknown error");
  }
  SUBCASE("pinned allocation") {
    fake_runtime_test::fake f;
    const auto& rt = f.api();
    f.fail_host_alloc(2);
    void* p = reinterpret_cast<void*>(std::uintptr_t{1});
    CHECK(rt.host_alloc(rt.self, &p, 100) == 2);
    CHECK(p == nullptr);
    CHECK(f.live_pinned() == 0);
    f.fail_host_alloc(0);
    CHECK(rt.host_alloc(rt.self, &p, 0) == 0);  // zero bytes still give a pointer
    CHECK(p != nullptr);
    CHECK(f.stats().host_allocs == 1);
    // Left allocated on purpose: the fake frees what is still live when it is destroyed.
  }
  SUBCASE("copies and synchronizations") {
    fake_runtime_test::fake f;
    const auto& rt = f.api();
    void* dev = f.device_malloc(4);
    fake_runtime_test::stream_and_event se(f);
    std::vector<std::byte> h = fake_runtime_test::filled(4, 5);
    auto copy = [&] {
      return rt.memcpy_async(rt.self, dev, h.data(), 4, cc::copy_kind::host_to_device, se.s);
    };
    f.fail_memcpy(2, 700);
    CHECK(copy() == 0);
    CHECK(rt.memcpy_async(rt.self, dev, h.data(), 4, cc::copy_kind::device_to_host, se.s) == 1);
    CHECK(copy() == 0);  // misuse above did not count toward `after`
    CHECK(copy() == 700);
    CHECK(copy() == 0);  // once only
    CHECK(f.stats().memcpy_calls == 3);
    f.fail_next_sync(700);
    CHECK(rt.stream_synchronize(rt.self, se.s) == 700);
    CHECK(f.pending_copies() == 0);  // the work ran; the fault is reported
    CHECK(f.device_read(dev, 4) == h);
    CHECK(rt.stream_synchronize(rt.self, se.s) == 0);
    f.fail_next_sync(999);
    CHECK(rt.event_synchronize(rt.self, se.e) == 999);
    CHECK(rt.event_synchronize(rt.self, se.e) == 0);
    // Left allocated on purpose: the destructor unmaps it.
  }
}
