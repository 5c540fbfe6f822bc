// tests/tree/fields_test.cpp: cairn/tree/fields.hpp: field_names() as a compile-time list,
// fields_of<T> (T::fields by default, a specialization for a type the user cannot edit, none
// for a plain struct), "" marking a field that is never visited, and the adapter<T> hook with a
// view by value (kept alive, tensor data in T's memory) and by reference (objects load into T).
#include "cairn/tree/fields.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cairn/core/sharded_object.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/tree/visit.hpp"

namespace fields_test {

struct named {
  std::int32_t a = 1;
  double b = 2;
  static constexpr auto fields = cairn::field_names("a", "b");
};

struct with_hidden {
  std::unique_ptr<int> handle;  // "": not state, and not visitable on its own
  std::vector<float> buf;       // "": the memory `w` views
  cairn::sharded_tensor<float> w;
  std::int64_t step = 3;
  static constexpr auto fields = cairn::field_names("", "", "w", "step");
};

struct plain {  // no names: cairn cannot visit it
  int x;
};

template <class T>
concept has_names = requires {
  cairn::fields_of<T>::names;
};

namespace vendor {
struct sgd {  // a type the user cannot edit
  double lr;
  double momentum;
};
struct tensor {  // a user tensor class
  std::vector<float> storage;
};
struct rng {  // a user type holding an object that must load in place
  cairn::sharded_object<std::uint64_t> state;
};
}  // namespace vendor

}  // namespace fields_test

template <>
struct cairn::fields_of<fields_test::vendor::sgd> {
  static constexpr auto names = cairn::field_names("lr", "momentum");
};

template <>
struct cairn::adapter<fields_test::vendor::tensor> {
  static cairn::sharded_tensor<float> view(fields_test::vendor::tensor& t) {
    return cairn::replicated("vendor.tensor", std::span(t.storage),
                             {static_cast<std::int64_t>(t.storage.size())}, 0);
  }
};

template <>
struct cairn::adapter<fields_test::vendor::rng> {
  static cairn::sharded_object<std::uint64_t>& view(fields_test::vendor::rng& r) { return r.state; }
};

TEST_CASE("field_names is a constexpr array of the names, in order") {
  constexpr auto names = cairn::field_names("w", "", "exp_avg_sq");
  static_assert(std::is_same_v<decltype(names), const std::array<std::string_view, 3>>);
  static_assert(names[0] == "w" && names[1].empty() && names[2] == "exp_avg_sq");
  static_assert(names[2].size() == 10);  // no terminating NUL in the view
  constexpr auto none = cairn::field_names();
  static_assert(none.empty());
  const char runtime[] = "step";
  CHECK(cairn::field_names(runtime)[0] == "step");
}

TEST_CASE("fields_of finds T::fields, a specialization, or nothing") {
  static_assert(cairn::fields_of<fields_test::named>::names == cairn::field_names("a", "b"));
  static_assert(cairn::fields_of<fields_test::vendor::sgd>::names[1] == "momentum");
  static_assert(fields_test::has_names<fields_test::named>);
  static_assert(!fields_test::has_names<fields_test::plain>);
  static_assert(cairn::visitable<fields_test::named>);
  static_assert(cairn::visitable<fields_test::vendor::sgd>);
  static_assert(!cairn::visitable<fields_test::plain>);

  fields_test::vendor::sgd opt{0.1, 0.9};
  auto leaves = cairn::flatten(opt);
  REQUIRE(leaves.commons.size() == 2);
  CHECK(leaves.commons[0].path == "lr");
  CHECK(leaves.commons[1].path == "momentum");
  CHECK(leaves.commons[1].value == &opt.momentum);
}

TEST_CASE("a field named \"\" is never visited") {
  fields_test::with_hidden s;
  s.buf = {1, 2, 3, 4};
  s.w = cairn::replicated("w", std::span(s.buf), {4}, 0);
  auto leaves = cairn::flatten(s);
  REQUIRE(leaves.tensors.size() == 1);
  CHECK(leaves.tensors[0].path == "w");
  CHECK(reinterpret_cast<float*>(leaves.tensors[0].data) == s.buf.data());
  REQUIRE(leaves.commons.size() == 1);  // buf, a vector of floats, would be a common value
  CHECK(leaves.commons[0].path == "step");
}

TEST_CASE("an adapter's view by value is kept alive and views T's memory") {
  fields_test::vendor::tensor t{{1, 2, 3}};
  auto leaves = cairn::flatten(t);
  REQUIRE(leaves.tensors.size() == 1);
  CHECK(leaves.tensors[0].sharding.key == "vendor.tensor");
  CHECK(leaves.tensors[0].nbytes == 3 * sizeof(float));
  CHECK(reinterpret_cast<float*>(leaves.tensors[0].data) == t.storage.data());
  CHECK(leaves.keep_alive.size() == 1);  // the sharded_tensor the adapter returned
}

TEST_CASE("an adapter's view by reference loads objects into T itself") {
  fields_test::vendor::rng r{cairn::per_rank("rng", std::uint64_t{5}, 0, 1)};
  auto leaves = cairn::flatten(r);
  CHECK(leaves.keep_alive.empty());
  REQUIRE(leaves.objects.size() == 1);
  CHECK(leaves.objects[0].value == &r.state.value);
  auto bytes = leaves.objects[0].encode(leaves.objects[0].value);
  r.state.value = 0;
  REQUIRE(leaves.objects[0].decode(bytes, leaves.objects[0].value).has_value());
  CHECK(r.state.value == 5);
}
