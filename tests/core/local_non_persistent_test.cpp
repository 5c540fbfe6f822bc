// tests/core/local_non_persistent_test.cpp: cairn/core/local_non_persistent.hpp: the wrapper's
// value and unwrap(), and its promise in a state tree: it yields no leaf, is never written to a
// checkpoint, and a load leaves it untouched, whatever the wrapped type.
#include "cairn/core/local_non_persistent.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cairn/comm/single.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/load.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/tree/fields.hpp"
#include "cairn/tree/visit.hpp"

namespace local_non_persistent_test {

struct handle {  // not visitable on its own: no fields, no codec, not a common value
  std::unique_ptr<int> fd;
};

struct state {
  std::vector<float> w_buf;
  cairn::sharded_tensor<float> w;
  std::int64_t step = 0;
  cairn::local_non_persistent<std::int64_t> scratch_step;
  cairn::local_non_persistent<std::vector<float>> cache;
  cairn::local_non_persistent<handle> h;
  static constexpr auto fields = cairn::field_names("", "w", "step", "scratch_step", "cache", "h");
};

inline void make(state& s, float seed) {
  s.w_buf = {seed, seed + 1, seed + 2};
  s.w = cairn::replicated("w", std::span(s.w_buf), {3}, 0);
}

}  // namespace local_non_persistent_test

TEST_CASE("local_non_persistent holds a value-initialized T that unwrap() references") {
  cairn::local_non_persistent<int> i;
  CHECK(i.value == 0);
  i.unwrap() = 5;
  CHECK(i.value == 5);
  const auto& ci = i;
  CHECK(&ci.unwrap() == &i.value);
  static_assert(std::is_same_v<decltype(ci.unwrap()), const int&>);
  static_assert(noexcept(i.unwrap()));

  cairn::local_non_persistent<std::vector<int>> v{{1, 2}};
  v.unwrap().push_back(3);
  CHECK(v.value == std::vector<int>{1, 2, 3});
  cairn::local_non_persistent<local_non_persistent_test::handle> h;  // move-only T
  CHECK(h.unwrap().fd == nullptr);
}

TEST_CASE("local_non_persistent is visitable whatever it wraps, and yields no leaf") {
  static_assert(cairn::visitable<cairn::local_non_persistent<local_non_persistent_test::handle>>);
  static_assert(!cairn::visitable<local_non_persistent_test::handle>);
  local_non_persistent_test::state s;
  local_non_persistent_test::make(s, 1);
  auto leaves = cairn::flatten(s);
  CHECK(leaves.tensors.size() == 1);
  REQUIRE(leaves.commons.size() == 1);
  CHECK(leaves.commons[0].path == "step");
  CHECK(leaves.objects.empty());
}

TEST_CASE("local_non_persistent values are not saved, and a load leaves them untouched") {
  cairn::memory_storage mem;
  cairn::single_communicator one;
  local_non_persistent_test::state saved;
  local_non_persistent_test::make(saved, 10);
  saved.step = 42;
  saved.scratch_step.value = 1000;
  saved.cache.value = {7, 7, 7};
  saved.h.value.fd = std::make_unique<int>(3);
  cairn::save(saved, mem, one);

  auto commons = cairn::load_common(mem).value();
  CHECK(commons.count("step") == 1);
  CHECK(commons.count("scratch_step") == 0);
  CHECK(cairn::load_tensors(mem).value().size() == 1);

  local_non_persistent_test::state back;
  local_non_persistent_test::make(back, 0);
  back.scratch_step.value = -1;
  back.cache.value = {1};
  back.h.value.fd = std::make_unique<int>(99);
  int* fd_before = back.h.value.fd.get();
  cairn::load(back, mem, one);
  CHECK(back.step == 42);
  CHECK(back.w_buf == std::vector<float>{10, 11, 12});
  CHECK(back.scratch_step.value == -1);
  CHECK(back.cache.value == std::vector<float>{1});
  CHECK(back.h.value.fd.get() == fd_before);
  CHECK(*back.h.value.fd == 99);
}
