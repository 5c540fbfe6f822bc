// Which leaves a load asks for (pipeline/keys.hpp): ignore globs, edit_keys and key_mapping over
// tensors, objects and commons; dropping keys the checkpoint lacks; and what each strict mode
// logs or raises.
#include "cairn/pipeline/keys.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace keys_test {

/// Leaves with tensors `t`, objects `o` and common paths `c` (no data: only keys matter here).
inline cairn::leaf_list leaves(std::vector<std::string> t,
                               std::vector<std::string> o = {},
                               std::vector<std::string> c = {}) {
  cairn::leaf_list l;
  for (auto& k : t) {
    cairn::tensor_leaf x;
    x.path = "tree." + k;
    x.sharding.key = k;
    l.tensors.push_back(x);
  }
  for (auto& k : o) {
    cairn::object_leaf x;
    x.key = k;
    l.objects.push_back(x);
  }
  for (auto& k : c) {
    cairn::common_leaf x;
    x.path = k;
    l.commons.push_back(x);
  }
  return l;
}

template <class List>
std::vector<std::string> keys_of(const List& list) {
  std::vector<std::string> out;
  for (const auto& l : list) out.push_back(cairn::detail::tree_key(l));
  return out;
}

}  // namespace keys_test

TEST_CASE("select_leaves applies ignore globs, then edit_keys, then key_mapping") {
  using V = std::vector<std::string>;
  auto in = keys_test::leaves({"model.w", "model.b", "optim.m/0", "head"}, {"rng"}, {"step"});
  in.keep_alive.push_back(std::make_shared<int>(1));
  in.after_load.push_back([] { return cairn::ok(); });

  cairn::load_options opt;
  SUBCASE("nothing asked: everything, unchanged, in order") {
    auto out = cairn::detail::select_leaves(in, opt);
    CHECK(keys_test::keys_of(out.tensors) == V{"model.w", "model.b", "optim.m/0", "head"});
    CHECK(out.tensors[0].path == "tree.model.w");
    CHECK(out.keep_alive.size() == 1);
    CHECK(out.after_load.size() == 1);
  }
  SUBCASE("globs match across '/' and over every kind of leaf") {
    opt.ignore_keys = {"optim.*", "s?ep", "model.[b]"};
    auto out = cairn::detail::select_leaves(in, opt);
    CHECK(keys_test::keys_of(out.tensors) == V{"model.w", "head"});
    CHECK(keys_test::keys_of(out.objects) == V{"rng"});
    CHECK(out.commons.empty());
  }
  SUBCASE("edit_keys sees the keys left after the globs, and may remove or add") {
    V seen;
    opt.ignore_keys = {"head"};
    opt.edit_keys = [&](V& keys) {
      seen = keys;
      std::erase(keys, "rng");
      keys.push_back("not_in_tree");  // adding a key loads nothing new
    };
    auto out = cairn::detail::select_leaves(in, opt);
    CHECK(seen == V{"model.w", "model.b", "optim.m/0", "rng", "step"});
    CHECK(keys_test::keys_of(out.tensors) == V{"model.w", "model.b", "optim.m/0"});
    CHECK(out.objects.empty());
    CHECK(keys_test::keys_of(out.commons) == V{"step"});
  }
  SUBCASE("key_mapping renames tree keys to checkpoint keys, after selection") {
    opt.key_mapping = {{"model.w", "old.w"}, {"rng", "old.rng"}, {"step", "iteration"}};
    opt.ignore_keys = {"old.*"};  // globs match tree keys, not mapped ones
    auto out = cairn::detail::select_leaves(in, opt);
    CHECK(keys_test::keys_of(out.tensors) == V{"old.w", "model.b", "optim.m/0", "head"});
    CHECK(out.tensors[0].path == "tree.model.w");  // the tree path stays
    CHECK(keys_test::keys_of(out.objects) == V{"old.rng"});
    CHECK(keys_test::keys_of(out.commons) == V{"iteration"});
  }
}

TEST_CASE("drop_unexpected drops keys the checkpoint lacks and returns every key asked for") {
  auto l = keys_test::leaves({"w", "gone", "b"}, {"rng", "gone_obj"}, {"step", "gone"});
  cairn::load_stats stats;
  auto requested = cairn::detail::drop_unexpected(l, {"w", "b", "rng", "step", "extra"}, stats);
  CHECK(requested == std::set<std::string>{"w", "gone", "b", "rng", "gone_obj", "step"});
  CHECK(keys_test::keys_of(l.tensors) == std::vector<std::string>{"w", "b"});
  CHECK(keys_test::keys_of(l.objects) == std::vector<std::string>{"rng"});
  CHECK(keys_test::keys_of(l.commons) == std::vector<std::string>{"step"});
  // Sorted, and "gone" (a tensor and a common) listed once.
  CHECK(stats.unexpected == std::vector<std::string>{"gone", "gone_obj"});

  cairn::load_stats none;
  auto all = keys_test::leaves({"w"});
  cairn::detail::drop_unexpected(all, {"w"}, none);
  CHECK(none.unexpected.empty());
  CHECK(all.tensors.size() == 1);
}

TEST_CASE("report_strict logs, raises or stays quiet as each strict mode says") {
  using sm = cairn::strict_mode;
  cairn::load_stats stats;
  stats.unexpected = {"u1", "u2"};
  stats.missing = {"m1"};
  std::vector<std::string> logged;
  cairn::load_options opt;
  opt.log = [&](const std::string& s) { logged.push_back(s); };

  CHECK(!cairn::detail::wants_missing(sm::assume_ok_unexpected));
  CHECK(!cairn::detail::wants_missing(sm::raise_unexpected));
  CHECK(cairn::detail::wants_missing(sm::log_all));
  CHECK(cairn::detail::wants_missing(sm::raise_all));
  CHECK(cairn::detail::wants_missing(sm::return_all));

  for (sm quiet :
       {sm::assume_ok_unexpected, sm::return_unexpected, sm::return_all, sm::ignore_all}) {
    opt.strict = quiet;
    CHECK(cairn::detail::report_strict(opt, 0, stats));
  }
  CHECK(logged.empty());

  opt.strict = sm::log_unexpected;
  REQUIRE(cairn::detail::report_strict(opt, 3, stats));
  REQUIRE(logged.size() == 1);  // missing keys are not this mode's business
  CHECK(logged[0].find("rank 3") != std::string::npos);
  CHECK(logged[0].find("u1, u2") != std::string::npos);

  logged.clear();
  opt.strict = sm::log_all;
  REQUIRE(cairn::detail::report_strict(opt, 1, stats));
  CHECK(logged.size() == 1);  // missing keys are logged by rank 0 only
  logged.clear();
  REQUIRE(cairn::detail::report_strict(opt, 0, stats));
  REQUIRE(logged.size() == 2);
  CHECK(logged[1].find("m1") != std::string::npos);

  opt.strict = sm::raise_unexpected;
  auto r = cairn::detail::report_strict(opt, 0, stats);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::not_found);
  CHECK(r.err().key == "u1");
  CHECK(r.err().message.find("u1, u2") != std::string::npos);

  opt.strict = sm::raise_all;
  cairn::load_stats only_missing;
  only_missing.missing = {"m1", "m2"};
  CHECK(cairn::detail::report_strict({.strict = sm::raise_unexpected}, 0, only_missing));
  auto m = cairn::detail::report_strict(opt, 2, only_missing);
  REQUIRE(!m);
  CHECK(m.err().code == cairn::errc::not_found);
  CHECK(m.err().key == "m1");
  CHECK(m.err().message.find("m1, m2") != std::string::npos);
}
