// tests/tree/leaves_test.cpp: cairn/tree/leaves.hpp: a leaf_list built by hand, with no template
// in sight, is everything save and load need: tensor leaves over user memory (their byte count
// checked against the sharding), objects and common values through their type-erased
// functions (errors named by key), views owned by keep_alive, after_load run in order.
#include "cairn/tree/leaves.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cairn/comm/single.hpp"
#include "cairn/load.hpp"
#include "cairn/save.hpp"
#include "cairn/storage/memory.hpp"

namespace leaves_test {

/// The memory a hand-built list points into.
struct target {
  std::vector<float> w;
  std::string notes;
  std::int64_t step = 0;
};

/// A tensor leaf "w" over `w` (f32, [4], one replica).
inline cairn::tensor_leaf tensor_over(std::vector<float>& w) {
  cairn::tensor_leaf t;
  t.path = "model.w";
  t.sharding.key = "w";
  t.sharding.type = cairn::dtype::f32;
  t.sharding.local_shape = t.sharding.global_shape = {4};
  t.sharding.global_offset = {0};
  t.data = reinterpret_cast<std::byte*>(w.data());
  t.nbytes = w.size() * sizeof(float);
  return t;
}

/// Leaves for every field of `x`; objects are the string, rejected on load when `refuse`.
inline cairn::leaf_list leaves_of(target& x) {
  cairn::leaf_list l;
  l.tensors.push_back(tensor_over(x.w));
  cairn::object_leaf o;
  o.path = o.key = "notes";
  o.global_shape = {1};
  o.global_offset = {0};
  o.value = &x.notes;
  o.encode = [](const void* v) {
    const auto& s = *static_cast<const std::string*>(v);
    auto b = std::as_bytes(std::span(s));
    return std::vector<std::byte>(b.begin(), b.end());
  };
  o.decode = [](std::span<const std::byte> in, void* v) -> cairn::result<void> {
    if (in.size() > 32) return cairn::make_error(cairn::errc::resource, "notes longer than 32");
    static_cast<std::string*>(v)->assign(reinterpret_cast<const char*>(in.data()), in.size());
    return cairn::ok();
  };
  l.objects.push_back(std::move(o));
  cairn::common_leaf c;
  c.path = "step";
  c.value = &x.step;
  c.encode = [](const void* v) {
    return cairn::common_value::of(*static_cast<const std::int64_t*>(v));
  };
  c.decode = [](const cairn::common_value& in, void* v) {
    return in.get(*static_cast<std::int64_t*>(v));
  };
  l.commons.push_back(std::move(c));
  return l;
}

inline void save_reference(cairn::memory_storage& mem, const std::string& notes) {
  target src{{1, 2, 3, 4}, notes, 17};
  cairn::single_communicator one;
  REQUIRE(cairn::detail::save_leaves(leaves_of(src), mem, one, {}).has_value());
}

}  // namespace leaves_test

TEST_CASE("a hand-built leaf list saves and loads through its type-erased functions") {
  cairn::memory_storage mem;
  leaves_test::save_reference(mem, "warmup done");
  CHECK(cairn::load_common(mem).value().at("step").as<std::int64_t>() == 17);
  CHECK(cairn::load_tensors(mem).value().at("w").global_shape == cairn::shape{4});

  leaves_test::target dst{{0, 0, 0, 0}, "", 0};
  cairn::single_communicator one;
  REQUIRE(cairn::detail::load_leaves(leaves_test::leaves_of(dst), mem, one, {}).has_value());
  CHECK(dst.w == std::vector<float>{1, 2, 3, 4});
  CHECK(dst.notes == "warmup done");
  CHECK(dst.step == 17);
}

TEST_CASE("a tensor leaf's byte count must match its sharding, on save and on load") {
  cairn::memory_storage mem;
  leaves_test::save_reference(mem, "n");
  cairn::single_communicator one;
  std::vector<float> w(4);
  for (auto [nbytes, message] :
       {std::pair<std::size_t, std::string>{12, "data holds 3 elements but the sharding needs 4"},
        {20, "data holds 5 elements but the sharding needs 4"},
        {10, "data size is not a multiple of the element size"},
        {0, "data holds 0 elements but the sharding needs 4"}}) {
    CAPTURE(nbytes);
    cairn::leaf_list l;
    l.tensors.push_back(leaves_test::tensor_over(w));
    l.tensors[0].nbytes = nbytes;
    cairn::memory_storage out;
    auto s = cairn::detail::save_leaves(l, out, one, {});
    REQUIRE_FALSE(s.has_value());
    CHECK(s.err().code == cairn::errc::invalid_argument);
    CHECK(s.err().key == "w");
    CHECK(s.err().message == message);
    auto r = cairn::detail::load_leaves(l, mem, one, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().key == "w");
    CHECK(r.err().message == message);
  }
}

TEST_CASE("an object leaf's decode error fails the load, named by its key") {
  cairn::memory_storage mem;
  leaves_test::save_reference(mem, std::string(40, 'x'));  // longer than decode accepts
  leaves_test::target dst{{0, 0, 0, 0}, "kept", 0};
  cairn::single_communicator one;
  auto r = cairn::detail::load_leaves(leaves_test::leaves_of(dst), mem, one, {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().code == cairn::errc::resource);
  CHECK(r.err().message == "notes longer than 32");
  CHECK(r.err().key == "notes");
  CHECK(dst.notes == "kept");
}

TEST_CASE("keep_alive owns what leaves point into, for as long as any copy of the list") {
  cairn::memory_storage mem;
  leaves_test::save_reference(mem, "n");
  cairn::leaf_list copy;
  std::weak_ptr<std::vector<float>> watch;
  {
    auto owned = std::make_shared<std::vector<float>>(4, -1.0f);
    watch = owned;
    cairn::leaf_list l;
    l.tensors.push_back(leaves_test::tensor_over(*owned));
    l.keep_alive.push_back(owned);
    copy = l;
  }
  REQUIRE_FALSE(watch.expired());  // the copy keeps it
  cairn::single_communicator one;
  REQUIRE(cairn::detail::load_leaves(copy, mem, one, {}).has_value());
  CHECK(*watch.lock() == std::vector<float>{1, 2, 3, 4});
  copy = cairn::leaf_list{};
  CHECK(watch.expired());
}

TEST_CASE("after_load runs in order after a successful load, and its error is the load's") {
  cairn::memory_storage mem;
  leaves_test::save_reference(mem, "n");
  cairn::single_communicator one;
  leaves_test::target dst{{0, 0, 0, 0}, "", 0};
  std::vector<std::string> log;
  auto l = leaves_test::leaves_of(dst);
  l.after_load.push_back([&]() -> cairn::result<void> {
    log.push_back("merge 1 sees w[3]=" + std::to_string(static_cast<int>(dst.w[3])));
    return cairn::ok();
  });
  l.after_load.push_back([&]() -> cairn::result<void> {
    log.push_back("merge 2");
    return cairn::ok();
  });
  SUBCASE("all succeed") {
    REQUIRE(cairn::detail::load_leaves(l, mem, one, {}).has_value());
    CHECK(log == std::vector<std::string>{"merge 1 sees w[3]=4", "merge 2"});
  }
  SUBCASE("one fails: the later ones do not run") {
    l.after_load.insert(l.after_load.begin() + 1, []() -> cairn::result<void> {
      return cairn::make_error(cairn::errc::mismatch, "fused parts disagree").with_key("qkv");
    });
    auto r = cairn::detail::load_leaves(l, mem, one, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == cairn::errc::mismatch);
    CHECK(r.err().message == "fused parts disagree");
    CHECK(r.err().key == "qkv");
    CHECK(log == std::vector<std::string>{"merge 1 sees w[3]=4"});
  }
  SUBCASE("a load that fails before does not run them") {
    l.tensors[0].sharding.global_shape = {5};
    l.tensors[0].sharding.local_shape = {5};
    std::vector<float> five(5);
    l.tensors[0].data = reinterpret_cast<std::byte*>(five.data());
    l.tensors[0].nbytes = 5 * sizeof(float);
    auto r = cairn::detail::load_leaves(l, mem, one, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == cairn::errc::mismatch);
    CHECK(r.err().key == "w");
    CHECK(log.empty());
  }
}
