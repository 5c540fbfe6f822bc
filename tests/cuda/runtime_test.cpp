// tests/cuda/runtime_test.cpp: device detection (probe, system_device, usable_runtime) in a host
// build, and the fake runtime's own contract (device memory the host cannot touch, deferred
// copies, misuse detection), which the stager tests rely on.
#include "cairn/cuda/runtime.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "cairn/cuda/testing/fake_runtime.hpp"

namespace cc = cairn::cuda;
using cc::testing::fake_runtime;

TEST_SUITE("cuda runtime") {
  TEST_CASE("probe reports devices, missing drivers and missing devices") {
    fake_runtime one;
    auto d = cc::probe(one.api());
    CHECK(d.usable);
    CHECK(d.count == 1);
    CHECK(d.reason.empty());

    fake_runtime none(0);
    d = cc::probe(none.api());
    CHECK_FALSE(d.usable);
    CHECK(d.code == 100);

    fake_runtime nodriver;
    nodriver.fail_device_count(35);
    d = cc::probe(nodriver.api());
    CHECK_FALSE(d.usable);
    CHECK(d.code == 35);
    CHECK(d.reason ==
          "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version "
          "(code 35)");

    cc::runtime_api empty;
    CHECK_FALSE(cc::probe(empty).usable);
  }

  TEST_CASE("usable_runtime returns an injected runtime only when it has a device") {
    fake_runtime one, none(0);
    CHECK(cc::usable_runtime(&one.api()) == &one.api());
    CHECK(cc::usable_runtime(&none.api()) == nullptr);
  }

#ifndef CAIRN_HAS_CUDA
  TEST_CASE("a host build has no default runtime and says why") {
    CHECK(cc::default_runtime() == nullptr);
    CHECK_FALSE(cc::system_device().usable);
    CHECK(cc::system_device().reason.find("without CUDA") != std::string::npos);
    CHECK(&cc::system_device() == &cc::system_device());  // probed once, cached
    CHECK(cc::usable_runtime() == nullptr);
  }
#endif

  TEST_CASE("fake runtime: device memory moves only through copies, which run at sync") {
    fake_runtime fake;
    const auto& rt = fake.api();
    std::vector<int> host(256);
    for (int i = 0; i < 256; ++i) host[static_cast<std::size_t>(i)] = i;
    void* dev = fake.device_malloc(sizeof(int) * 256);
    cc::memory_type t{};
    int d = -1;
    CHECK(rt.pointer_get_attributes(rt.self, dev, &t, &d) == 0);
    CHECK(t == cc::memory_type::device);
    CHECK(rt.pointer_get_attributes(rt.self, static_cast<char*>(dev) + 100, &t, &d) == 0);
    CHECK(t == cc::memory_type::device);
    CHECK(rt.pointer_get_attributes(rt.self, host.data(), &t, &d) == 0);
    CHECK(t == cc::memory_type::unregistered);

    cc::stream_t s = nullptr;
    cc::event_t e = nullptr;
    REQUIRE(rt.stream_create(rt.self, &s) == 0);
    REQUIRE(rt.event_create(rt.self, &e) == 0);
    REQUIRE(rt.memcpy_async(rt.self, dev, host.data(), 1024, cc::copy_kind::host_to_device, s) ==
            0);
    std::vector<int> back(256, -1);
    REQUIRE(rt.memcpy_async(rt.self, back.data(), dev, 1024, cc::copy_kind::device_to_host, s) ==
            0);
    REQUIRE(rt.event_record(rt.self, e, s) == 0);
    CHECK(back[5] == -1);  // deferred: nothing ran yet
    CHECK(fake.pending_copies() == 2);
    REQUIRE(rt.event_synchronize(rt.self, e) == 0);
    CHECK(back == host);
    CHECK(fake.pending_copies() == 0);

    // Misuse is refused and recorded.
    CHECK(rt.memcpy_async(rt.self, back.data(), dev, 1024, cc::copy_kind::host_to_host, s) == 1);
    CHECK(rt.memcpy_async(rt.self, back.data(), dev, 2048, cc::copy_kind::device_to_host, s) == 1);
    CHECK(rt.memcpy_async(rt.self, back.data(), host.data(), 8, cc::copy_kind::device_to_host, s) ==
          1);
    CHECK(fake.misuse().size() == 3);

    REQUIRE(rt.event_destroy(rt.self, e) == 0);
    REQUIRE(rt.stream_destroy(rt.self, s) == 0);
    CHECK(fake.live_streams() == 0);
    CHECK(fake.live_events() == 0);
    fake.device_free(dev);
  }
}
