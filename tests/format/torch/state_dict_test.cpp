// The torch_save format (format/torch/state_dict.hpp): torch.save state dicts detected and read
// as a checkpoint — nested keys, shared storages, common values, several files — loaded on any
// number of ranks and converted; what it cannot read in place is refused naming key and file.
#include "cairn/format/torch/state_dict.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/dcp/writer.hpp"
#include "cairn/format/torch/zip.hpp"
#include "tests/support/torch_files.hpp"

namespace {

namespace tz = cairn::torch_zip;
using cairn::pickle::value;

using cairn_test::put_pt;

/// Element i of model.w's storage (24 floats: w is its first 18 as [3, 6], b its last 6).
float element(int i) { return static_cast<float>(i * 3 - 7) / 4.0f; }

/// {"model": {"w": [3, 6] f32, "b": [6] f32 sharing w's storage}, "iteration": 7,
///  "optimizer": {"param_groups": [{"lr": 0.5, "betas": [0.9, 0.99]}]}, "args": an object}
void save_state_dict(cairn::memory_storage& st, std::vector<float>& storage) {
  storage.resize(24);
  for (int i = 0; i < 24; ++i) storage[static_cast<std::size_t>(i)] = element(i);
  value model =
      value::dict({{value::string("w"), tz::tensor_value(cairn::dtype::f32, {3, 6}, "0", 24)},
                   {value::string("b"), tz::tensor_value(cairn::dtype::f32, {6}, "0", 24, 18)}});
  value group = value::dict(
      {{value::string("lr"), value::floating(0.5)},
       {value::string("betas"), value::list({value::floating(0.9), value::floating(0.99)})}});
  value root = value::dict(
      {{value::string("model"), model},
       {value::string("iteration"), value::integer(7)},
       {value::string("optimizer"),
        value::dict({{value::string("param_groups"), value::list({group})}})},
       {value::string("args"), value::instance("argparse", "Namespace", value::tuple())}});
  const std::vector<std::span<const std::byte>> storages{std::as_bytes(std::span(storage))};
  put_pt(st, "model_optim_rng.pt", root, storages);
}

}  // namespace

TEST_CASE("torch_save: a torch.save file is detected and described as one chunk per tensor") {
  cairn::memory_storage st;
  std::vector<float> storage;
  save_state_dict(st, storage);
  CHECK(cairn::detect_format(st).value() == "torch_save");
  auto m = cairn::read_any_metadata(st).value();
  CHECK(m.format == "torch_save");
  REQUIRE(m.tensors.size() == 2);
  CHECK(m.tensors.at("model.w").global_shape == cairn::shape{3, 6});
  CHECK(m.tensors.at("model.b").global_shape == cairn::shape{6});
  REQUIRE(m.tensors.at("model.b").chunks.size() == 1);
  // b lies 18 floats into the storage w starts: the same record, 72 bytes on.
  CHECK(m.tensors.at("model.b").chunks[0].where.byte_offset ==
        m.tensors.at("model.w").chunks[0].where.byte_offset + 72);
  CHECK(m.inline_commons.count("iteration") == 1);
  CHECK(m.inline_commons.count("optimizer.param_groups.0.lr") == 1);
  CHECK(m.inline_commons.count("optimizer.param_groups.0.betas") == 1);
  CHECK(m.inline_commons.count("args") == 0);  // a Python object: left out
  CHECK(cairn::load_tensors(st).value().at("model.b").as<float>()[5] == element(23));
}

TEST_CASE("torch_save: loads on any number of ranks, element-exact, with its common values") {
  cairn::memory_storage st;
  std::vector<float> storage;
  save_state_dict(st, storage);
  for (int ranks : {1, 2, 3}) {
    CAPTURE(ranks);
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      const int r = comm.rank();
      // model.w split by columns (6 / ranks each), model.b replicated.
      const std::int64_t cols = 6 / ranks;
      std::vector<float> w(static_cast<std::size_t>(3 * cols), -1.0f), b(6, -1.0f);
      cairn::sharded_tensor<float> tw;
      tw.key = "model.w";
      tw.global_shape = {3, 6};
      tw.local_shape = {3, cols};
      tw.global_offset = {0, cols * r};
      tw.data = std::span(w);
      cairn::state_dict sd;
      sd.add("model.w", tw);
      sd.add("model.b", cairn::replicated("model.b", std::span(b), {6}, r));
      sd.add("iteration", std::int64_t{0});
      sd.add("optimizer.param_groups.0.lr", 0.0);
      cairn::load_options lo;
      lo.strict = cairn::strict_mode::raise_unexpected;
      cairn::load(sd, st, comm, lo);
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          CHECK(w[static_cast<std::size_t>(i * cols + j)] ==
                element(static_cast<int>(i * 6 + cols * r + j)));
      for (int j = 0; j < 6; ++j) CHECK(b[static_cast<std::size_t>(j)] == element(18 + j));
      CHECK(std::get<cairn::common_value>(*sd.find("iteration")).as<std::int64_t>() == 7);
      CHECK(std::get<cairn::common_value>(*sd.find("optimizer.param_groups.0.lr")).as<double>() ==
            0.5);
    });
  }
}

TEST_CASE("torch_save: several files (Hugging Face shards) and a bare tensor") {
  cairn::memory_storage st;
  std::vector<float> a(4, 1.5f), c(2, -2.0f);
  std::vector<std::int64_t> n{5, 6, 7};
  put_pt(st, "pytorch_model-00001-of-00002.bin",
         value::dict({{value::string("a"), tz::tensor_value(cairn::dtype::f32, {2, 2}, "0", 4)}}),
         {std::as_bytes(std::span(a))});
  put_pt(st, "pytorch_model-00002-of-00002.bin",
         value::dict({{value::string("c"), tz::tensor_value(cairn::dtype::f32, {2}, "0", 2)}}),
         {std::as_bytes(std::span(c))});
  put_pt(st, "counts.pt", tz::tensor_value(cairn::dtype::i64, {3}, "0", 3),
         {std::as_bytes(std::span(n))});
  st.put("notes.bin", std::as_bytes(std::span("not torch", 9))).value();  // not read
  auto all = cairn::load_tensors(st).value();
  REQUIRE(all.size() == 3);
  CHECK(all.at("a").as<float>()[3] == 1.5f);
  CHECK(all.at("c").as<float>()[1] == -2.0f);
  CHECK(all.at("counts").as<std::int64_t>()[2] == 7);  // keyed by the file's stem

  // The same key in two files: refused, naming it and both files.
  put_pt(st, "extra.pt",
         value::dict({{value::string("a"), tz::tensor_value(cairn::dtype::f32, {2}, "0", 2)}}),
         {std::as_bytes(std::span(c))});
  auto twice = cairn::read_any_metadata(st);
  REQUIRE(!twice);
  CHECK(twice.err().code == cairn::errc::corrupt);
  CHECK(twice.err().key == "a");
  CHECK(twice.err().message.find("extra.pt") != std::string::npos);
  CHECK(twice.err().message.find("pytorch_model-00001-of-00002.bin") != std::string::npos);
}

TEST_CASE("torch_save: convert reads it, and a lying storage record is refused") {
  cairn::memory_storage st, out;
  std::vector<float> storage;
  save_state_dict(st, storage);
  auto src = cairn::convert::open_source(st).value();
  CHECK(src->kind() == "torch_save");
  cairn::convert::convert_options opt;
  opt.format = cairn::convert::output_format::native;
  cairn::convert::convert(*src, out, opt).value();
  auto back = cairn::load_tensors(out).value();
  CHECK(back.at("model.w").as<float>()[17] == element(17));
  CHECK(cairn::load_common(out).value().count("iteration") == 1);

  // A tensor claiming more elements than its storage record holds.
  cairn::memory_storage bad;
  std::vector<float> few(4, 0.0f);
  put_pt(bad, "model.pt",
         value::dict({{value::string("w"), tz::tensor_value(cairn::dtype::f32, {8}, "0", 8)}}),
         {std::as_bytes(std::span(few))});
  auto r = cairn::read_any_metadata(bad);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::corrupt);
  CHECK(r.err().key == "w");
  CHECK(r.err().file.find("model.pt") != std::string::npos);
}
