// The writers' half of the format registry (format/writers.hpp): each built-in id makes the
// writer of its format, a registration replaces an earlier one of the same id, every call makes
// a fresh strategy, and an unknown id fails naming what is registered.
#include "cairn/format/writers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/strategies.hpp"

namespace writers_test {

/// A strategy that only says which maker made it.
class named final : public cairn::save_strategy {
 public:
  explicit named(std::string n) : name_(std::move(n)) {}
  std::string_view name() const noexcept override { return name_; }
  cairn::result<void> write(cairn::planned_save&,
                            cairn::storage_ref,
                            const cairn::save_options&,
                            cairn::buffer_pool*,
                            cairn::written_save&) const override {
    return cairn::make_error(cairn::errc::invalid_argument, "not for saving");
  }
  cairn::result<void> commit(cairn::planned_save&,
                             cairn::written_save&,
                             const std::vector<cairn::bytes>&,
                             const std::vector<cairn::bytes>&,
                             cairn::storage_ref,
                             const cairn::save_options&) const override {
    return cairn::ok();
  }

 private:
  std::string name_;
};

}  // namespace writers_test

TEST_CASE("make_save_strategy: each built-in id saves in the format it names") {
  const std::pair<const char*, const char*> ids[] = {{"native", "cairn"},
                                                     {"torch_dist", "torch_dist"},
                                                     {"one_file", "safetensors"},
                                                     {"per_tensor", "safetensors"},
                                                     {"chunks", "safetensors"}};
  std::vector<float> w(6);
  std::iota(w.begin(), w.end(), 0.5f);
  for (const auto& [id, format] : ids) {
    INFO(id);
    auto s = cairn::make_save_strategy(id);
    REQUIRE(s);
    cairn::memory_storage mem;
    cairn::single_communicator one;
    cairn::state_dict sd;
    sd.add("w", cairn::from_rank_offsets("w", std::span(w), {2, 3}, {}));
    cairn::save(sd, mem, one, {.strategy = s->get()});
    CHECK(cairn::detect_format(mem).value() == format);
    std::vector<float> back(6, 0.0f);
    cairn::state_dict ld;
    ld.add("w", cairn::from_rank_offsets("w", std::span(back), {2, 3}, {}));
    cairn::load(ld, mem, one);
    CHECK(back == w);
  }
}

TEST_CASE("make_save_strategy makes a fresh strategy on every call") {
  auto a = cairn::make_save_strategy("native").value();
  auto b = cairn::make_save_strategy("native").value();
  CHECK(a.get() != b.get());
  CHECK(a->name() == b->name());
  // The id is looked up as a view: no terminating NUL needed.
  std::string_view longer = "chunksXYZ";
  auto c = cairn::make_save_strategy(longer.substr(0, 6));
  REQUIRE(c);
  CHECK((*c)->name() == "chunks");
}

TEST_CASE("register_save_strategy adds an id, and registering it again replaces the maker") {
  CHECK(cairn::register_save_strategy("writers_test_id", [] {
    return std::unique_ptr<cairn::save_strategy>(new writers_test::named("first"));
  }));
  CHECK(cairn::make_save_strategy("writers_test_id").value()->name() == "first");
  auto ids = cairn::save_strategy_ids();
  CHECK(std::is_sorted(ids.begin(), ids.end()));
  CHECK(std::count(ids.begin(), ids.end(), "writers_test_id") == 1);

  CHECK(cairn::register_save_strategy("writers_test_id", [] {
    return std::unique_ptr<cairn::save_strategy>(new writers_test::named("second"));
  }));
  CHECK(cairn::make_save_strategy("writers_test_id").value()->name() == "second");
  auto again = cairn::save_strategy_ids();
  CHECK(again.size() == ids.size());  // replaced, not added
}

TEST_CASE("make_save_strategy of an unknown id fails naming it and every registered id") {
  for (std::string_view id : {std::string_view("npz"), std::string_view(""),
                              std::string_view("Native"), std::string_view("native ")}) {
    INFO("'" << id << "'");
    auto r = cairn::make_save_strategy(id);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::not_found);
    CHECK(r.err().message.find("'" + std::string(id) + "'") != std::string::npos);
    for (const auto& known : cairn::save_strategy_ids())
      CHECK(r.err().message.find(known) != std::string::npos);
    CHECK(r.err().message.find("cairn/strategies.hpp") != std::string::npos);
  }
}
