// The deepspeed format (format/deepspeed/zero.hpp): ZeRO stage 2 and 3 checkpoints built here in
// DeepSpeed's layout (tests/system/interop/deepspeed_layout.py writes them with torch, and the
// interop test compares with zero_to_fp32's result) detected through `latest` or as a tag
// folder, their fp32 partitions mapped back to the parameters and loaded on any number of
// ranks, and what the reader refuses, naming the file.
#include "cairn/format/deepspeed/zero.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/torch/zip.hpp"
#include "tests/support/torch_files.hpp"

namespace {

namespace tz = cairn::torch_zip;
using cairn::pickle::value;

using cairn_test::put_pt;

/// `collections.OrderedDict` with `entries`, as torch pickles one (REDUCE + SETITEMS).
value ordered(std::vector<std::pair<value, value>> entries) {
  value d = value::instance("collections", "OrderedDict", value::tuple(), value(), false);
  d.obj->dict_items = std::move(entries);
  return d;
}

/// `torch.Size(dims)`.
value size(std::vector<std::int64_t> dims) {
  std::vector<value> xs;
  for (auto d : dims) xs.push_back(value::integer(d));
  return value::instance("torch", "Size", value::tuple({value::tuple(xs)}), value(), false);
}

/// `getattr(ZeroStageEnum, name)`, as Python 3.11 pickles an enum member.
value stage_by_name(const std::string& name) {
  return value::instance(
      "builtins", "getattr",
      value::tuple(
          {value::global("deepspeed.runtime.zero.config", "ZeroStageEnum"), value::string(name)}),
      value(), false);
}

/// The master value of element i of the flat parameters w (15) then b (4).
float master(std::int64_t i) { return static_cast<float>(i) * 0.5f - 3.0f; }

/// The model states: w [3, 5] and b [4] in one group, `head` tied to w, a buffer `steps` (i64,
/// the file's storage 0).
value model_states(int dp) {
  value shapes = ordered({{value::string("w"), size({3, 5})}, {value::string("b"), size({4})}});
  return value::dict(
      {{value::string("module"),
        ordered({{value::string("steps"), tz::tensor_value(cairn::dtype::i64, {2}, "0", 2)}})},
       {value::string("buffer_names"), value::list({value::string("steps")})},
       {value::string("optimizer"), value::none()},
       {value::string("param_shapes"), value::list({shapes})},
       {value::string("frozen_param_shapes"), ordered({})},
       {value::string("shared_params"), value::dict({{value::string("head"), value::string("w")}})},
       {value::string("frozen_param_fragments"), ordered({})},
       {value::string("global_steps"), value::integer(7)},
       {value::string("global_samples"), value::integer(56)},
       {value::string("dp_world_size"), value::integer(dp)},
       {value::string("mp_world_size"), value::integer(1)},
       {value::string("ds_version"), value::string("0.16.5")}});
}

/// A ZeRO-2 checkpoint of w and b over `dp` ranks under `tag`/ of `st`: the 19 elements padded
/// to a multiple of 2 x dp, each rank's partition saved without its padding.
void save_zero2(cairn::memory_storage& st,
                int dp,
                std::vector<std::vector<float>>& parts,
                std::vector<std::int64_t>& steps) {
  const std::string tag = "global_step7/";
  steps = {11, 12};
  put_pt(st, tag + "mp_rank_00_model_states.pt", model_states(dp),
         {std::as_bytes(std::span(steps))});
  const std::int64_t total = (19 + 2 * dp - 1) / (2 * dp) * (2 * dp), per = total / dp;
  parts.assign(static_cast<std::size_t>(dp), {});
  for (int r = 0; r < dp; ++r) {
    auto& p = parts[static_cast<std::size_t>(r)];
    for (std::int64_t i = r * per; i < (r + 1) * per; ++i) p.push_back(i < 19 ? master(i) : 0.0f);
    const std::int64_t kept = std::max<std::int64_t>(0, std::min(per, 19 - r * per));
    value osd =
        value::dict({{value::string("single_partition_of_fp32_groups"),
                      value::list({tz::tensor_value(cairn::dtype::f32, {kept}, "0", per)})},
                     {value::string("zero_stage"), stage_by_name("gradients")},
                     {value::string("group_paddings"), value::list({value::integer(per - kept)})},
                     {value::string("partition_count"), value::list({value::integer(dp)})}});
    put_pt(st, tag + "bf16_zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt",
           value::dict({{value::string("optimizer_state_dict"), osd}}),
           {std::as_bytes(std::span(p))});
  }
  auto w = st.open_writer("latest").value();
  const std::string t = "global_step7";
  w->write_at(0, std::as_bytes(std::span(t))).value();
  w->finish().value();
}

/// A ZeRO-3 checkpoint over `dp` ranks in `st` itself (a tag folder): each parameter cut into
/// ceil(n / dp) elements per rank, rank r's flat group its pieces of w then b, padded with -1.
void save_zero3(cairn::memory_storage& st,
                int dp,
                std::vector<std::vector<float>>& flats,
                std::vector<std::int64_t>& steps) {
  steps = {11, 12};
  flats.assign(static_cast<std::size_t>(dp), {});
  const std::int64_t pw = (15 + dp - 1) / dp, pb = (4 + dp - 1) / dp;
  for (int r = 0; r < dp; ++r) {
    auto& f = flats[static_cast<std::size_t>(r)];
    for (std::int64_t i = r * pw; i < (r + 1) * pw; ++i) f.push_back(i < 15 ? master(i) : -1.0f);
    for (std::int64_t i = r * pb; i < (r + 1) * pb; ++i)
      f.push_back(i < 4 ? master(15 + i) : -1.0f);
    put_pt(st, "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_model_states.pt",
           model_states(dp), {std::as_bytes(std::span(steps))});
    value osd = value::dict(
        {{value::string("zero_stage"),  // as Python <= 3.10 pickles an enum member
          value::instance("deepspeed.runtime.zero.config", "ZeroStageEnum",
                          value::tuple({value::integer(3)}), value(), false)},
         {value::string("partition_count"), value::integer(dp)},
         {value::string("fp32_flat_groups"),
          value::list({tz::tensor_value(cairn::dtype::f32, {pw + pb}, "0", pw + pb)})}});
    put_pt(st, "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt",
           value::dict({{value::string("optimizer_state_dict"), osd}}),
           {std::as_bytes(std::span(f))});
  }
}

/// w, b and head loaded on `ranks` thread ranks (rows of w split over them), compared with the
/// masters; returns the elements that differ.
int load_and_count_wrong(cairn::storage_ref st, int ranks) {
  std::atomic<int> wrong{0};
  cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
    const std::int64_t lo = 3 * comm.rank() / ranks, hi = 3 * (comm.rank() + 1) / ranks;
    std::vector<float> w(static_cast<std::size_t>((hi - lo) * 5), -9.0f), b(4, -9.0f),
        head(15, -9.0f);
    std::vector<std::int64_t> steps(2, -1);
    cairn::state_dict sd;
    sd.add("w", cairn::block("w", std::span(w), {hi - lo, 5}, {3, 5}, {lo, 0}));
    sd.add("b", cairn::replicated("b", std::span(b), {4}, comm.rank()));
    sd.add("head", cairn::replicated("head", std::span(head), {3, 5}, comm.rank()));
    sd.add("steps", cairn::replicated("steps", std::span(steps), {2}, comm.rank()));
    // A key the checkpoint lacks (head, steps) would fail the load.
    cairn::load(sd, st, comm, {.strict = cairn::strict_mode::raise_unexpected});
    for (std::int64_t i = 0; i < (hi - lo) * 5; ++i)
      wrong += w[static_cast<std::size_t>(i)] != master(lo * 5 + i);
    for (std::int64_t i = 0; i < 4; ++i) wrong += b[static_cast<std::size_t>(i)] != master(15 + i);
    for (std::int64_t i = 0; i < 15; ++i) wrong += head[static_cast<std::size_t>(i)] != master(i);
    wrong += steps != std::vector<std::int64_t>{11, 12};
  });
  return wrong;
}

}  // namespace

TEST_CASE("deepspeed: a ZeRO-2 save folder is detected through latest and loads on any ranks") {
  for (int dp : {1, 2, 3}) {
    INFO("saved on " << dp << " data-parallel ranks");
    cairn::memory_storage st;
    std::vector<std::vector<float>> parts;
    std::vector<std::int64_t> steps;
    save_zero2(st, dp, parts, steps);
    CHECK(cairn::detect_format(st).value() == "deepspeed");
    auto m = cairn::read_any_metadata(st).value();
    CHECK(m.format == "deepspeed");
    CHECK(m.world_size == dp);
    CHECK(m.tensors.at("w").global_shape == cairn::shape{3, 5});
    CHECK(m.tensors.at("w").type == cairn::dtype::f32);
    CHECK(m.tensors.at("steps").type == cairn::dtype::i64);  // a buffer keeps its dtype
    CHECK(m.inline_commons.at("global_steps").as<std::int64_t>() == 7);
    CHECK(m.inline_commons.at("zero_stage").as<std::int64_t>() == 2);
    CHECK(m.inline_commons.at("ds_version").as<std::string>() == "0.16.5");
    // w's 15 elements span the ranks' partitions: one run of chunks per rank it meets.
    if (dp == 3) CHECK(m.tensors.at("w").chunks.size() > 2);
    for (int ranks : {1, 2, 3}) {
      INFO("loaded on " << ranks);
      CHECK(load_and_count_wrong(st, ranks) == 0);
    }
    auto whole = cairn::load_tensors(st, {"b"}).value();
    CHECK(whole.at("b").as<float>()[3] == master(18));
  }
}

TEST_CASE("deepspeed: a ZeRO-3 tag folder loads on any ranks, the padding left out") {
  for (int dp : {2, 3, 4}) {
    INFO("saved on " << dp << " data-parallel ranks");
    cairn::memory_storage st;
    std::vector<std::vector<float>> flats;
    std::vector<std::int64_t> steps;
    save_zero3(st, dp, flats, steps);
    CHECK(cairn::detect_format(st).value() == "deepspeed");
    auto m = cairn::read_any_metadata(st).value();
    CHECK(m.inline_commons.at("zero_stage").as<std::int64_t>() == 3);
    for (int ranks : {1, 2, 3}) {
      INFO("loaded on " << ranks);
      CHECK(load_and_count_wrong(st, ranks) == 0);
    }
  }
}

TEST_CASE("deepspeed: what the reader refuses names the file") {
  auto refused = [](cairn::memory_storage& st) {
    auto m = cairn::read_any_metadata(st);
    REQUIRE(!m);
    return m.err();
  };
  std::vector<std::vector<float>> parts;
  std::vector<std::int64_t> steps;
  SUBCASE("a rank's optimizer states missing") {
    cairn::memory_storage st;
    save_zero2(st, 3, parts, steps);
    st.remove("global_step7/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").value();
    auto e = refused(st);
    CHECK(e.code == cairn::errc::corrupt);
    CHECK(e.message.find("rank 1 are missing") != std::string::npos);
  }
  SUBCASE("the last rank's missing: partition_count says how many saved") {
    cairn::memory_storage st;
    save_zero2(st, 3, parts, steps);
    st.remove("global_step7/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt").value();
    auto e = refused(st);
    CHECK(e.message.find("saved by 3 data-parallel ranks, but 2") != std::string::npos);
    CHECK(e.file.find("optim_states.pt") != std::string::npos);
  }
  SUBCASE("model parallelism") {
    cairn::memory_storage st;
    save_zero2(st, 2, parts, steps);
    auto w = st.open_writer("global_step7/mp_rank_01_model_states.pt").value();
    w->finish().value();
    auto e = refused(st);
    CHECK(e.code == cairn::errc::unsupported_version);
    CHECK(e.file.find("mp_rank_01_model_states.pt") != std::string::npos);
  }
  SUBCASE("partitions shorter than the parameters") {
    cairn::memory_storage st;
    save_zero3(st, 2, parts, steps);
    // Rank 1's flat group cut short: the reader refuses it before reading.
    std::vector<float> shorter(3, 0.0f);
    value osd = value::dict({{value::string("zero_stage"), stage_by_name("weights")},
                             {value::string("partition_count"), value::integer(2)},
                             {value::string("fp32_flat_groups"),
                              value::list({tz::tensor_value(cairn::dtype::f32, {3}, "0", 3)})}});
    put_pt(st, "zero_pp_rank_1_mp_rank_00_optim_states.pt",
           value::dict({{value::string("optimizer_state_dict"), osd}}),
           {std::as_bytes(std::span(shorter))});
    auto e = refused(st);
    CHECK(e.code == cairn::errc::corrupt);
    CHECK(e.key == "w");
    CHECK(e.file.find("zero_pp_rank_1_mp_rank_00_optim_states.pt") != std::string::npos);
  }
  SUBCASE("a latest that leaves the folder") {
    cairn::memory_storage st;
    save_zero2(st, 2, parts, steps);
    auto w = st.open_writer("latest").value();
    const std::string t = "../elsewhere";
    w->write_at(0, std::as_bytes(std::span(t))).value();
    w->finish().value();
    CHECK(!cairn::deepspeed_as_metadata(st));
  }
}

TEST_CASE("deepspeed: files cut short or with flipped bytes fail cleanly, never crash") {
  std::vector<std::vector<float>> parts;
  std::vector<std::int64_t> steps;
  cairn::memory_storage clean;
  save_zero2(clean, 2, parts, steps);
  const std::vector<std::string> names = clean.list("global_step7/").value();
  int refused = 0, tried = 0;
  for (const std::string& name : names) {
    const std::uint64_t n = clean.size(name).value();
    std::vector<std::byte> bytes(n);
    clean.read(name, 0, bytes).value();
    for (std::uint64_t cut = 0; cut < n; cut += std::max<std::uint64_t>(1, n / 23)) {
      for (int mode = 0; mode < 2; ++mode) {
        cairn::memory_storage st;
        for (const std::string& other : clean.list("").value()) {
          std::vector<std::byte> b(clean.size(other).value());
          clean.read(other, 0, b).value();
          if (other == name) {
            if (mode == 0)
              b.resize(cut);  // cut short
            else
              b[cut] = b[cut] ^ std::byte{0x5a};  // one byte flipped
          }
          st.put(other, b).value();
        }
        ++tried;
        auto m = cairn::read_any_metadata(st);
        if (!m) {
          ++refused;
          continue;
        }
        (void)cairn::load_tensors(st);  // an error or values; never a crash
      }
    }
  }
  CHECK(tried > 100);
  CHECK(refused > 0);
}
