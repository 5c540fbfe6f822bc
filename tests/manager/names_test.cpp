// Checkpoint name templates (manager/names.hpp): fields, widths, escaped braces, matching a name
// back to its fields, and the templates that are refused.
#include "cairn/manager/names.hpp"

#include <doctest/doctest.h>

#include <string>

TEST_SUITE("name templates") {
  TEST_CASE("fields, widths, braces and their errors") {
    auto t = cairn::name_template::parse("ep{epoch}-ba{batch:06d}-{{x}}").value();
    CHECK(t.format({.epoch = 3, .batch = 42}, 8).value() == "ep3-ba000042-{x}");
    CHECK(t.format({.epoch = -2, .batch = -5}, 8).value() == "ep-2-ba-00005-{x}");
    auto back = t.match("ep3-ba000042-{x}");
    REQUIRE(back);
    CHECK(back->epoch == 3);
    CHECK(back->batch == 42);
    CHECK(!t.match("ep3-ba42"));
    CHECK(!t.match("ep3x-ba000042-{x}"));
    auto tagged = cairn::name_template::parse("{tag}-step{step}").value();
    auto m = tagged.match("global-step-x-step12");
    REQUIRE(m);
    CHECK(m->tag == "global-step-x");
    CHECK(m->step == 12);
    CHECK(tagged.format({.step = 1, .tag = "a/b"}, 1).err().code == cairn::errc::invalid_argument);
    CHECK(tagged.format({.step = 1, .tag = ""}, 1).value() == "-step1");
    auto world = cairn::name_template::parse("s{step}-of{world_size}").value();
    CHECK(world.format({.step = 7}, 16).value() == "s7-of16");
    CHECK(world.match("s7-of16")->step == 7);
    for (const char* bad :
         {"step{rank}", "step{steps}", "step{step", "step}", "a/{step}", "constant",
          "w{world_size}", "{step}{epoch}", "{step:x}", "{tag:3}", "{step:99}"}) {
      CAPTURE(bad);
      auto r = cairn::name_template::parse(bad);
      REQUIRE(!r);
      CHECK(r.err().code == cairn::errc::invalid_argument);
    }
    CHECK(cairn::name_template::parse("step{rank}").err().message.find("every rank") !=
          std::string::npos);
  }
}
