// fp32_masters / select_keys: a mixed-precision checkpoint (a bf16 model, a distributed
// optimizer's fp32 masters as flat slices over 2 ranks, frozen parameters without masters)
// unshards to the masters under the model's keys, from cairn's own layout and Megatron's names,
// read as cairn and as torch_dist; the refusals name the keys.
#include "cairn/convert/masters.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/safetensors/file.hpp"
#include "tests/support/filled_block.hpp"
#include "tests/support/test_util.hpp"

namespace masters_test {  // named: unity builds merge anonymous namespaces
using cairn::box;
using cairn::dtype;
using cairn::shape;
namespace cv = cairn::convert;

/// How a tensor of a test checkpoint is held by the 2 ranks.
enum class held { rows, replicated, flat };

struct spec {
  std::string key;
  dtype type;
  shape global;
  held how;
};

/// The whole tensor `s` as the test fills it (its values follow from its key).
std::vector<std::byte> whole(const spec& s) {
  return cairn_test::filled_whole(s.key, s.type, s.global);
}

/// Saves `specs` on 2 thread ranks with the common values `commons` (int64 each).
void save_specs(cairn::storage_ref st,
                const std::vector<spec>& specs,
                const std::vector<std::string>& commons = {}) {
  cairn::run_ranks(2, [&](cairn::thread_communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<std::byte>> bufs(specs.size());
    cairn::state_dict sd;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const spec& s = specs[i];
      cairn::sharded_tensor<> t;
      t.key = s.key;
      t.type = s.type;
      t.global_shape = s.global;
      box b{shape(s.global.size(), 0), s.global};
      if (s.how == held::rows) b.offset[0] = r * s.global[0] / 2, b.size[0] = s.global[0] / 2;
      if (s.how == held::replicated) t.replica_id = r;
      t.local_shape = b.size;
      t.global_offset = b.offset;
      std::vector<std::byte> blk = cairn_test::filled_block(s.key, s.type, s.global, b);
      if (s.how == held::flat) {  // a distributed optimizer's slice of the whole tensor
        const std::int64_t v = b.volume(), lo = v * r / 2, hi = v * (r + 1) / 2;
        t.flattened_range = cairn::flat_range{lo, hi};
        bufs[i] = cairn_test::flat_slice(blk, cairn::dtype_size(s.type), *t.flattened_range);
      } else {
        bufs[i] = std::move(blk);
      }
      t.data = bufs[i];
      sd.add(s.key, t);
    }
    for (const auto& c : commons) sd.add(c, std::int64_t{7});
    cairn::save(sd, st, comm);
  });
}

/// cairn's libtorch adapter with `masters`: a bf16 model, its optimizer's fp32 masters and
/// moments under optim.state.<name>, one frozen parameter without a master.
const std::vector<spec> kAdapter = {
    {"model.layers.0.w", dtype::bf16, {4, 6}, held::rows},
    {"model.norm", dtype::bf16, {6}, held::replicated},
    {"model.frozen", dtype::bf16, {3}, held::replicated},
    {"optim.state.layers.0.w.fp32_param", dtype::f32, {4, 6}, held::flat},
    {"optim.state.layers.0.w.exp_avg", dtype::f32, {4, 6}, held::flat},
    {"optim.state.norm.fp32_param", dtype::f32, {6}, held::flat},
    {"optim.state.norm.exp_avg", dtype::f32, {6}, held::flat},
};

const spec& find_spec(const std::vector<spec>& specs, const std::string& key) {
  for (const auto& s : specs)
    if (s.key == key) return s;
  FAIL("no spec " << key);
  return specs.front();
}

/// The tensors of the safetensors file `out/model.safetensors`: key -> (dtype, bytes).
std::map<std::string, std::pair<dtype, std::vector<std::byte>>> read_all(cairn::file_storage& out) {
  std::map<std::string, std::pair<dtype, std::vector<std::byte>>> m;
  auto h = cairn::safetensors::read_header(out, "model.safetensors").value();
  for (const auto& t : h.tensors) {
    std::vector<std::byte> b(t.nbytes());
    cairn::safetensors::read_tensor(out, "model.safetensors", h, t.name, b).value();
    m[t.name] = {t.type, std::move(b)};
  }
  return m;
}

/// Unshards `src` with fp32_masters into `out` and checks that each model key of
/// `expected` (model key -> the spec whose values it must hold) is there, and nothing else.
void check_masters(cv::source& src,
                   cairn::file_storage& out,
                   const std::vector<spec>& specs,
                   const std::map<std::string, std::string>& expected) {
  cv::convert_options opt;
  opt.fp32_masters = true;
  auto stats = cv::unshard(src, out, opt).value();
  CHECK(stats.tensors == expected.size());
  auto got = read_all(out);
  CHECK(got.size() == expected.size());
  for (const auto& [key, from] : expected) {
    INFO(key << " from " << from);
    REQUIRE(got.count(key));
    const spec& s = find_spec(specs, from);
    CHECK(got[key].first == s.type);
    CHECK(got[key].second == whole(s));
  }
}

TEST_CASE("fp32_masters: the adapter's masters under the model's keys, frozen ones as saved") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out"), dist(d.path / "dist"),
      out2(d.path / "out2"), native(d.path / "native");
  save_specs(ck, kAdapter, {"optim.state.layers.0.w.step", "optim.param_groups.0.lr", "step"});
  const std::map<std::string, std::string> expected = {
      {"model.layers.0.w", "optim.state.layers.0.w.fp32_param"},
      {"model.norm", "optim.state.norm.fp32_param"},
      {"model.frozen", "model.frozen"}};
  auto src = cv::open_source(ck).value();
  check_masters(*src, out, kAdapter, expected);

  SUBCASE("the optimizer's common values are left out, the others kept") {
    cv::convert_options opt;
    opt.fp32_masters = true;
    opt.format = cv::output_format::native;
    cv::convert(*src, native, opt).value();
    auto back = cv::open_source(native).value();
    auto commons = back->commons().value();
    CHECK(commons.size() == 1);
    CHECK(commons.count("step"));
    CHECK(back->tensors().size() == 3);
  }
  SUBCASE("the same from the checkpoint converted to torch_dist") {
    cv::convert_options opt;
    opt.format = cv::output_format::torch_dist;
    cv::convert(*src, dist, opt).value();
    auto dcp = cv::open_source(dist).value();
    CHECK(dcp->kind() == "torch_dist");
    check_masters(*dcp, out2, kAdapter, expected);
  }
  SUBCASE("with a selection after it: the masters without the model's prefix") {
    cv::convert_options opt;
    opt.fp32_masters = true;
    opt.select = [](std::string_view k) -> std::optional<std::string> {
      if (k == "model.frozen") return std::nullopt;
      return std::string(k.substr(k.find('.') + 1));
    };
    CHECK(cv::unshard(*src, out2, opt).value().tensors == 2);
    auto got = read_all(out2);
    CHECK(got.size() == 2);
    CHECK(got["layers.0.w"].second ==
          whole(find_spec(kAdapter, "optim.state.layers.0.w.fp32_param")));
    CHECK(got["norm"].second == whole(find_spec(kAdapter, "optim.state.norm.fp32_param")));
  }
  SUBCASE("without fp32_masters the optimizer's state is written as it is") {
    auto stats = cv::unshard(*src, out2, {}).value();
    CHECK(stats.tensors == kAdapter.size());
    CHECK(read_all(out2)["model.layers.0.w"].first == dtype::bf16);
  }
}

TEST_CASE("fp32_masters: Megatron's fp32_param and fully_reshardable param names") {
  const std::vector<spec> specs = {
      {"decoder.w", dtype::bf16, {4, 6}, held::rows},
      {"decoder.b", dtype::bf16, {4}, held::replicated},
      {"embedding.word_embeddings.weight", dtype::bf16, {8, 2}, held::rows},
      {"optimizer.state.fp32_param.decoder.w", dtype::f32, {4, 6}, held::flat},
      {"optimizer.state.exp_avg.decoder.w", dtype::f32, {4, 6}, held::flat},
      {"optimizer.state.param.decoder.b", dtype::f32, {4}, held::replicated},
      {"optimizer.state.exp_avg_sq.decoder.b", dtype::f32, {4}, held::replicated},
  };
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_specs(ck, specs);
  auto src = cv::open_source(ck).value();
  check_masters(*src, out, specs,
                {{"decoder.w", "optimizer.state.fp32_param.decoder.w"},
                 {"decoder.b", "optimizer.state.param.decoder.b"},
                 {"embedding.word_embeddings.weight", "embedding.word_embeddings.weight"}});
}

TEST_CASE("fp32_masters: a name matches whole components only") {
  const std::vector<spec> specs = {
      {"model.w", dtype::bf16, {4, 6}, held::rows},
      {"model.new_w", dtype::bf16, {4, 6}, held::rows},  // ends with "w", not with ".w"
      {"w2", dtype::bf16, {4, 6}, held::rows},
      {"optim.state.w.fp32_param", dtype::f32, {4, 6}, held::flat},
  };
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_specs(ck, specs);
  auto src = cv::open_source(ck).value();
  check_masters(
      *src, out, specs,
      {{"model.w", "optim.state.w.fp32_param"}, {"model.new_w", "model.new_w"}, {"w2", "w2"}});
}

TEST_CASE("fp32_masters refuses what it cannot map, naming the keys") {
  cairn_test::temp_dir d;
  auto refusal = [&](const std::string& name, const std::vector<spec>& specs) {
    cairn::file_storage ck(d.path / name);
    save_specs(ck, specs);
    auto src = cv::open_source(ck).value();
    auto sel = cv::fp32_masters(*src);
    REQUIRE_FALSE(sel);
    CHECK(sel.err().code == cairn::errc::invalid_argument);
    // convert and unshard refuse alike, before writing anything
    cairn::file_storage out(d.path / (name + "_out"));
    cv::convert_options opt;
    opt.fp32_masters = true;
    auto r = cv::unshard(*src, out, opt);
    REQUIRE_FALSE(r);
    CHECK(r.err().message == sel.err().message);
    return sel.err();
  };
  SUBCASE("no masters") {
    auto e = refusal("none", {{"model.w", dtype::bf16, {4, 6}, held::rows},
                              {"optim.state.w.exp_avg", dtype::f32, {4, 6}, held::flat}});
    CHECK(e.message.find("holds no fp32 master weights") != std::string::npos);
  }
  SUBCASE("a master of no model tensor") {
    auto e = refusal("orphan", {{"model.w", dtype::bf16, {4, 6}, held::rows},
                                {"optim.state.v.fp32_param", dtype::f32, {4, 6}, held::flat}});
    CHECK(e.key == "optim.state.v.fp32_param");
    CHECK(e.message.find("no model tensor is called so or ends with .v") != std::string::npos);
  }
  SUBCASE("a master whose name ends two model keys") {
    auto e = refusal("ambiguous", {{"a.w", dtype::bf16, {4, 6}, held::rows},
                                   {"b.w", dtype::bf16, {4, 6}, held::rows},
                                   {"optim.state.w.fp32_param", dtype::f32, {4, 6}, held::flat}});
    CHECK(e.message.find("several model tensors end with it: a.w, b.w") != std::string::npos);
  }
  SUBCASE("a master of another shape") {
    auto e = refusal("shape", {{"model.w", dtype::bf16, {4, 6}, held::rows},
                               {"optim.state.w.fp32_param", dtype::f32, {4, 5}, held::flat}});
    CHECK(e.message.find("has shape [4, 5], its parameter 'model.w' [4, 6]") != std::string::npos);
  }
}

TEST_CASE("select_keys renames and leaves out, and refuses two keys written as one") {
  cairn_test::temp_dir d;
  cairn::file_storage ck(d.path / "ckpt"), out(d.path / "out");
  save_specs(ck, kAdapter, {"step"});
  auto src = cv::open_source(ck).value();
  // The model alone, without its prefix.
  cv::convert_options opt;
  opt.select = [](std::string_view k) -> std::optional<std::string> {
    if (!k.starts_with("model.")) return std::nullopt;
    return std::string(k.substr(6));
  };
  auto stats = cv::unshard(*src, out, opt).value();
  CHECK(stats.tensors == 3);
  auto got = read_all(out);
  CHECK(got.count("layers.0.w"));
  CHECK(got["norm"].second == whole(find_spec(kAdapter, "model.norm")));
  auto view = cv::select_keys(*src, opt.select).value();
  CHECK(view->find("frozen"));
  CHECK_FALSE(view->find("model.frozen"));
  CHECK(view->commons().value().empty());  // "step" is not under model.

  auto clash = cv::select_keys(
      *src, [](std::string_view) -> std::optional<std::string> { return std::string("x"); });
  REQUIRE_FALSE(clash);
  CHECK(clash.err().code == cairn::errc::invalid_argument);
  CHECK(clash.err().message.find("would be written as 'x'") != std::string::npos);
  CHECK_FALSE(cv::select_keys(*src, nullptr));
}

}  // namespace masters_test
