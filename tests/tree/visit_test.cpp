// Visitation of user trees: paths, containers, hooks, skipped fields.
#include "cairn/tree/visit.hpp"

#include <doctest/doctest.h>

#include <unordered_map>

namespace {
struct inner {
  cairn::sharded_tensor<float> w;
  std::int32_t count = 0;
  static constexpr auto fields = cairn::field_names("w", "count");
};
struct outer {
  std::vector<float> buffer;  // skipped
  std::vector<inner> layers;
  std::unordered_map<std::string, double> sched;
  std::optional<std::string> name;
  std::optional<std::string> absent;
  std::tuple<std::int64_t, bool> pair;
  std::array<std::int16_t, 2> arr{};
  cairn::local_non_persistent<int> scratch;
  static constexpr auto fields =
      cairn::field_names("", "layers", "sched", "name", "absent", "pair", "arr", "scratch");
};
}  // namespace

namespace their {
struct adam {  // a type the user cannot edit
  double lr;
  std::int64_t step;
};
struct tensor {  // a user tensor class
  std::vector<float> storage;
};
}  // namespace their

template <>
struct cairn::fields_of<their::adam> {
  static constexpr auto names = cairn::field_names("lr", "step");
};
template <>
struct cairn::adapter<their::tensor> {
  static cairn::sharded_tensor<float> view(their::tensor& t) {
    return cairn::replicated("their.tensor", std::span(t.storage),
                             {static_cast<std::int64_t>(t.storage.size())}, 0);
  }
};

TEST_CASE("paths join field names, indices and map keys with '.'") {
  outer o;
  o.layers.resize(2);
  std::vector<float> buf(4);
  o.layers[1].w = cairn::replicated("", std::span(buf), {4}, 0);
  o.sched = {{"b", 1.0}, {"a", 2.0}};
  o.name = "x";
  auto leaves = cairn::flatten(o);
  REQUIRE(leaves.tensors.size() == 2);
  CHECK(leaves.tensors[0].path == "layers.0.w");
  CHECK(leaves.tensors[1].sharding.key == "layers.1.w");  // empty key: the path
  CHECK(leaves.tensors[1].nbytes == 16);
  std::vector<std::string> paths;
  for (const auto& c : leaves.commons) paths.push_back(c.path);
  CHECK(paths == std::vector<std::string>{"layers.0.count", "layers.1.count", "sched.a", "sched.b",
                                          "name", "pair.0", "pair.1", "arr.0", "arr.1"});
}

namespace {
struct holder {
  their::adam opt{0.1, 3};
  their::tensor t{{1, 2, 3}};
  static constexpr auto fields = cairn::field_names("opt", "t");
};
}  // namespace

TEST_CASE("fields_of and adapter hooks for types the user cannot edit") {
  holder h;
  auto leaves = cairn::flatten(h);
  REQUIRE(leaves.commons.size() == 2);
  CHECK(leaves.commons[0].path == "opt.lr");
  CHECK(leaves.commons[1].encode(leaves.commons[1].value).as<std::int64_t>() == 3);
  REQUIRE(leaves.tensors.size() == 1);
  CHECK(leaves.tensors[0].sharding.key == "their.tensor");
  CHECK(reinterpret_cast<float*>(leaves.tensors[0].data) == h.t.storage.data());
}

TEST_CASE("common leaves decode in place") {
  inner i;
  i.count = 5;
  auto leaves = cairn::flatten(i);
  REQUIRE(leaves.commons.size() == 1);
  CHECK(
      leaves.commons[0].decode(cairn::common_value::of(std::int32_t{9}), leaves.commons[0].value));
  CHECK(i.count == 9);
  CHECK(!leaves.commons[0].decode(cairn::common_value::of(9.0), leaves.commons[0].value));
}

TEST_CASE("state_dict entries are visited in name order with nested paths") {
  cairn::state_dict sd;
  std::vector<float> buf(2);
  sd.add("z", cairn::replicated("", std::span(buf), {2}, 0));
  sd.add("a", std::int64_t{1});
  sd.child("opt").add("lr", 0.5);
  sd.add("rng", cairn::byte_object{"rng", {std::byte{1}}, {1}, {0}, 0});
  auto leaves = cairn::flatten(sd);
  CHECK(leaves.tensors.at(0).sharding.key == "z");
  CHECK(leaves.commons.at(0).path == "a");
  CHECK(leaves.commons.at(1).path == "opt.lr");
  CHECK(leaves.objects.at(0).key == "rng");
  CHECK(sd.erase("a"));
  CHECK(sd.find("a") == nullptr);
}
