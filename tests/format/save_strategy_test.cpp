// The save_strategy interface (format/save_strategy.hpp): a user-written strategy plugs into save,
// and scalable planning refuses a strategy that needs the whole index.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <random>

#include "cairn/async/saver.hpp"
#include "cairn/cairn.hpp"
#include "cairn/convert/diff.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/strategies.hpp"
#include "tests/support/property.hpp"
#include "tests/support/train_state.hpp"

using namespace cairn_test;

namespace {

/// A user-written strategy: the native layout, plus a `MANIFEST` of every data file that
/// rank 0 writes just before the commit (what an orchestration system might wait for).
class manifest_strategy final : public cairn::save_strategy {
 public:
  std::string_view name() const noexcept override { return "native+manifest"; }
  cairn::writer_features features(const cairn::save_options& opt) const noexcept override {
    cairn::writer_features f;
    f.tile = native_.features(opt).tile;
    return f;
  }
  cairn::result<void> write(cairn::planned_save& plan,
                            cairn::storage_ref st,
                            const cairn::save_options& opt,
                            cairn::buffer_pool* buffers,
                            cairn::written_save& out) const override {
    return native_.write(plan, st, opt, buffers, out);
  }
  cairn::result<void> commit(cairn::planned_save& plan,
                             cairn::written_save& w,
                             const std::vector<cairn::bytes>& reports,
                             const std::vector<cairn::bytes>& assembled,
                             cairn::storage_ref st,
                             const cairn::save_options& opt) const override {
    std::string manifest;
    for (const auto& f :
         cairn::native_strategy::metadata_of(plan.index, plan.save_id, reports).files)
      manifest += f.name + " rank " + std::to_string(f.rank) + "\n";
    CAIRN_TRY(st.put("MANIFEST", std::as_bytes(std::span(manifest))));
    return native_.commit(plan, w, reports, assembled, st, opt);
  }
  void abandon(const cairn::planned_save& plan,
               const cairn::written_save& w,
               cairn::storage_ref st) const override {
    native_.abandon(plan, w, st);
  }

 private:
  cairn::native_strategy native_;
};

}  // namespace

TEST_CASE("a user-written strategy plugs into save, the checkpoint loads as usual") {
  cairn::memory_storage mem;
  manifest_strategy mine;
  cairn::save_options so;
  so.strategy = &mine;
  std::mt19937 rng(3);
  property_case c = random_case(rng, {{"w", cairn::dtype::f32, {8, 6}}}, 3, 2);
  save_on_threads(mem, c, 3, layout_kind::block, so);
  std::vector<std::byte> manifest(mem.size("MANIFEST").value());
  mem.read("MANIFEST", 0, manifest).value();
  std::string text(reinterpret_cast<const char*>(manifest.data()), manifest.size());
  CHECK(text.find(".cairn rank ") != std::string::npos);
  CHECK(load_failures_on_threads(mem, c, 2, layout_kind::block).empty());
}

TEST_CASE("scalable planning refuses a strategy that needs the whole index") {
  cairn::memory_storage mem;
  const cairn::torch_dist_strategy torch_dist;
  cairn::save_options so;
  so.scalable_planning = true;
  so.strategy = &torch_dist;
  cairn::state_dict sd;
  sd.add("step", std::int64_t{1});
  cairn::single_communicator one;
  auto r = cairn::try_save(sd, mem, one, so);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::invalid_argument);
  CHECK(r.err().message.find("torch_dist") != std::string::npos);
}
