// The format registry (format/registry.hpp, format/writers.hpp): writers made by format id, and
// a user's own writer registered beside them.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/strategies.hpp"

namespace {

/// A user's writer: the native format under another id, wrapping the native strategy (no
/// `cairn::detail` name needed).
class wrapped_native final : public cairn::save_strategy {
 public:
  std::string_view name() const noexcept override { return "wrapped_native"; }
  /// The native tiles, and none of its optional steps (this wrapper does not route).
  cairn::writer_features features(const cairn::save_options& o) const noexcept override {
    cairn::writer_features f;
    f.tile = native_.features(o).tile;
    return f;
  }
  cairn::result<void> write(cairn::planned_save& plan,
                            cairn::storage_ref st,
                            const cairn::save_options& opt,
                            cairn::buffer_pool* buffers,
                            cairn::written_save& out) const override {
    ++writes;
    return native_.write(plan, st, opt, buffers, out);
  }
  cairn::result<void> commit(cairn::planned_save& plan,
                             cairn::written_save& w,
                             const std::vector<cairn::bytes>& reports,
                             const std::vector<cairn::bytes>& locals,
                             cairn::storage_ref st,
                             const cairn::save_options& opt) const override {
    return native_.commit(plan, w, reports, locals, st, opt);
  }
  void abandon(const cairn::planned_save& plan,
               const cairn::written_save& w,
               cairn::storage_ref st) const override {
    native_.abandon(plan, w, st);
  }
  cairn::result<bool> committed(const cairn::planned_save& plan,
                                const cairn::written_save& w,
                                cairn::storage_ref st) const override {
    return native_.committed(plan, w, st);
  }
  static inline int writes = 0;

 private:
  cairn::native_strategy native_;
};

const bool wrapped_registered = cairn::register_save_strategy(
    "wrapped_native", [] { return std::unique_ptr<cairn::save_strategy>(new wrapped_native()); });

}  // namespace

TEST_CASE("make_save_strategy makes the writer of each registered format id") {
  CHECK(wrapped_registered);
  for (std::string id : {"native", "torch_dist", "one_file", "per_tensor", "chunks"}) {
    INFO(id);
    auto s = cairn::make_save_strategy(id);
    REQUIRE(s);
    CHECK((*s)->name() == id);
  }
  auto ids = cairn::save_strategy_ids();
  CHECK(std::is_sorted(ids.begin(), ids.end()));
  CHECK(std::find(ids.begin(), ids.end(), "wrapped_native") != ids.end());
  auto unknown = cairn::make_save_strategy("npz");
  REQUIRE(!unknown);
  CHECK(unknown.err().code == cairn::errc::not_found);
  CHECK(unknown.err().message.find("'npz'") != std::string::npos);
  CHECK(unknown.err().message.find("torch_dist") != std::string::npos);  // names what there is
}

TEST_CASE("a user's writer registered by id saves a checkpoint that load reads") {
  std::vector<float> w(12);
  std::iota(w.begin(), w.end(), 1.0f);
  cairn::state_dict sd;
  sd.add("w", cairn::from_rank_offsets("w", std::span(w), {3, 4}, {}));
  cairn::memory_storage mem;
  cairn::single_communicator one;
  auto s = cairn::make_save_strategy("wrapped_native").value();
  const int before = wrapped_native::writes;
  cairn::save(sd, mem, one, {.strategy = s.get()});
  CHECK(wrapped_native::writes == before + 1);
  CHECK(cairn::detect_format(mem).value() == "cairn");
  std::vector<float> back(12, 0.0f);
  cairn::state_dict ld;
  ld.add("w", cairn::from_rank_offsets("w", std::span(back), {3, 4}, {}));
  cairn::load(ld, mem, one);
  CHECK(back == w);
}
