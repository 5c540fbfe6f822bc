// The format registry (format/registry.hpp, format/writers.hpp): writers made by format id, a
// user's own writer registered beside them, and a user's own format registered as a driver
// (detection, commit marker, reader).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
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

namespace {

/// A test-only format: a checkpoint is committed by its `TESTFMT` object.
cairn::result<bool> holds_testfmt(cairn::storage_ref st) { return st.exists("TESTFMT"); }

cairn::result<cairn::checkpoint_metadata> read_testfmt(cairn::storage_ref) {
  cairn::checkpoint_metadata m;
  m.format = "test_registry_fmt";
  m.save_id = "from the test reader";
  return m;
}

cairn::result<bool> holds_noreader(cairn::storage_ref st) { return st.exists("NOREADER"); }

void put_text(cairn::storage_ref st, std::string_view name, std::string_view text) {
  cairn::put_checked(st, name, std::as_bytes(std::span(text.data(), text.size()))).value();
}

}  // namespace

TEST_CASE("a format registered as a driver is detected, read and committed by its marker") {
  cairn::format_driver d;
  d.id = "test_registry_fmt";
  d.detect_order = 50;
  d.commit_markers = {"TESTFMT"};
  d.detect = &holds_testfmt;
  d.read = &read_testfmt;
  CHECK(cairn::register_format(d));
  cairn::memory_storage st;
  put_text(st, "TESTFMT", "anything");
  CHECK(cairn::detect_format(st).value() == "test_registry_fmt");
  auto m = cairn::read_any_metadata(st);
  REQUIRE(m.has_value());
  CHECK(m->save_id == "from the test reader");
  // Registered again without a reader (say, to change its detection order): the reader stays.
  d.read = nullptr;
  CHECK(cairn::register_format(d));
  CHECK(cairn::read_any_metadata(st).has_value());
  // Commit markers: the native one, the built-in foreign ones, and this one.
  for (const char* marker : {"metadata.json", ".metadata", "model.safetensors", "TESTFMT"})
    CHECK(cairn::is_commit_marker(marker));
  CHECK_FALSE(cairn::is_commit_marker("__0_0.distcp"));
  // Detection order: the built-in foreign formats first, then this one.
  std::vector<std::string> ids;
  for (const auto& f : cairn::registered_formats()) ids.push_back(f.id);
  const auto at = [&](const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) - ids.begin();
  };
  CHECK(at("torch_dist") < at("safetensors"));
  CHECK(at("safetensors") < at("test_registry_fmt"));
  // A checkpoint of it, with its marker, is complete in a checkpointer's listing.
  cairn::memory_storage root;
  put_text(root, "run1/TESTFMT", "x");
  put_text(root, "run2/data", "x");  // no marker: an unfinished save
  auto listed = cairn::list_checkpoints(root, nullptr, "", false).value();
  REQUIRE(listed.size() == 2);
  for (const auto& e : listed) CHECK(e.complete == (e.name == "run1"));
}

TEST_CASE("a detected format without a reader is named in the error") {
  CHECK(cairn::register_format(
      cairn::format_driver{"test_no_reader", 60, {"NOREADER"}, &holds_noreader, nullptr}));
  cairn::memory_storage st;
  put_text(st, "NOREADER", "x");
  CHECK(cairn::detect_format(st).value() == "test_no_reader");
  auto m = cairn::read_any_metadata(st);
  REQUIRE_FALSE(m.has_value());
  CHECK(m.err().code == cairn::errc::unsupported_version);
  CHECK(m.err().message.find("test_no_reader") != std::string::npos);
}

TEST_CASE(
    "a folder of checkpoints of any registered format is named as such, not as a checkpoint") {
  cairn::memory_storage root;
  put_text(root, "step_1/.metadata", "x");  // a DCP checkpoint's commit marker
  put_text(root, "step_2/model.safetensors", "x");
  auto m = cairn::read_any_metadata(root);
  REQUIRE(!m);
  CHECK(m.err().code == cairn::errc::not_found);
  CHECK(m.err().message.find("folder of checkpoints") != std::string::npos);
  CHECK(m.err().message.find("step_2 and 1 more") != std::string::npos);
  // The native reader alone knows its own marker only.
  auto native = cairn::read_metadata(root);
  REQUIRE(!native);
  CHECK(native.err().code == cairn::errc::incomplete_checkpoint);
  // A metadata.json that is not cairn's (Megatron's, without DCP's .metadata) is its own error.
  cairn::memory_storage megatron;
  put_text(megatron, "metadata.json", R"({"sharded_backend": "torch_dist"})");
  auto mm = cairn::read_any_metadata(megatron);
  REQUIRE(!mm);
  CHECK(mm.err().code == cairn::errc::corrupt);
}
