// tests/format/conformance_test.cpp: the format conformance suite (tables in conformance.hpp).
// Every writer (save strategies, convert, unshard) saves states of every dtype it holds on N
// thread ranks, sharded in blocks, flat slices or per layer; every reader (load on M ranks in
// three shardings and with read-once broadcast, open_source whole and random boxes,
// consolidate, read_any_metadata, load_tensors, verify_checkpoint) reads them back
// byte-exactly, for N→M in 1→3, 4→2, 3→5, 2→1, 4→4. Then: each writer's output is the same
// bytes on every run; every dtype has a name in the safetensors and torch tables; a dtype a
// file or an option names that cairn or the format cannot represent is refused, naming it.
#include "tests/format/conformance.hpp"

#include <doctest/doctest.h>

#include <set>

using namespace cairn_test;
using namespace cairn_test::conformance;

namespace {

const std::pair<int, int> topologies[] = {{1, 3}, {4, 2}, {3, 5}, {2, 1}, {4, 4}};
const layout_kind save_kinds[] = {layout_kind::block, layout_kind::flattened,
                                  layout_kind::prepended};

/// Three tensors of 0 to 3 axes (extents 1..13) for case `case_index` of writer `salt`: their
/// dtypes walk through `types`, so consecutive cases hold every one of them. Keys hold a '/'
/// and a '.' (per_tensor file names, Megatron paths).
std::vector<tensor_spec> case_specs(std::mt19937& rng,
                                    int case_index,
                                    int salt,
                                    const std::vector<cairn::dtype>& types) {
  static const char* const keys[] = {"w", "layers/1/proj.weight", "opt.exp_avg"};
  std::vector<tensor_spec> specs;
  for (int i = 0; i < 3; ++i) {
    tensor_spec s;
    s.key = keys[i];
    s.type = types[static_cast<std::size_t>(case_index * 3 + i + salt) % types.size()];
    int axes = static_cast<int>(rng() % 4);
    for (int a = 0; a < axes; ++a) s.global.push_back(1 + static_cast<std::int64_t>(rng() % 13));
    specs.push_back(std::move(s));
  }
  return specs;
}

/// Every dtype.
const std::vector<cairn::dtype> every_dtype(cairn::all_dtypes.begin(), cairn::all_dtypes.end());

/// Replaces every occurrence of `id` in `text` (a string, or bytes) by as many 'X'.
template <class Text>
void mask(Text& text, const std::string& id) {
  if (id.empty() || text.size() < id.size()) return;
  for (std::size_t at = 0; at + id.size() <= text.size(); ++at) {
    bool match = true;
    for (std::size_t k = 0; k < id.size() && match; ++k)
      match = static_cast<char>(text[at + k]) == id[k];
    if (!match) continue;
    for (std::size_t k = 0; k < id.size(); ++k)
      text[at + k] = static_cast<typename Text::value_type>('X');
  }
}

/// The files of `st` with the save id `id` masked out of names and contents, and the checksum
/// of a native metadata.json (a function of the rest, the id included).
std::map<std::string, std::vector<std::byte>> masked_files(cairn::memory_storage& st,
                                                           const std::string& id) {
  std::map<std::string, std::vector<std::byte>> out;
  for (auto& [name, bytes] : all_files(st)) {
    std::string n = name;
    mask(n, id);
    mask(bytes, id);
    if (name == "metadata.json") {
      std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      const std::string field = "\"metadata_checksum\":\"";
      auto at = text.find(field);
      if (at != std::string::npos) mask(bytes, text.substr(at + field.size(), 16));
    }
    out.emplace(std::move(n), std::move(bytes));
  }
  return out;
}

/// What `f()` throws, described ("" when it returns).
template <class F>
std::string what_throws(F&& f) {
  try {
    f();
    return {};
  } catch (const cairn::exception& e) {
    return e.err().describe();
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("conformance: every writer × every reader × N→M × dtype reads back element-exactly") {
  const auto& ws = writers();
  const auto& rs = readers();
  int writes = 0, reads = 0, gaps_seen = 0;
  for (std::size_t wi = 0; wi < ws.size(); ++wi) {
    const writer& w = ws[wi];
    std::mt19937 rng(20261123u + static_cast<unsigned>(wi));
    std::set<cairn::dtype> dtypes;
    bool exercised = false;
    int case_index = 0;
    for (const auto& topology : topologies) {
      const int n = topology.first, m = topology.second;
      for (layout_kind save_kind : save_kinds) {
        property_case c =
            random_case(rng, case_specs(rng, case_index++, static_cast<int>(wi), w.holds()), n, m);
        for (const auto& s : c.specs) dtypes.insert(s.type);
        cairn::memory_storage out;
        INFO("writer " << w.name << ", N=" << n << " saved as " << std::string(kind_name(save_kind))
                       << ", M=" << m);
        ++writes;
        if (std::string thrown = what_throws([&] { w.write(out, c, n, save_kind); });
            !thrown.empty()) {
          FAIL_CHECK("the writer failed: " << thrown);
          continue;
        }
        for (const auto& f : all_files(out)) {
          INFO("left " << f.first);
          CHECK(w.owns_file(f.first));
        }
        exercised = exercised || w.exercised(out, c);
        for (const reader& r : rs) {
          INFO("reader " << r.name);
          failures found;
          if (std::string thrown = what_throws([&] { found = r.read(w, out, c, m, rng); });
              !thrown.empty())
            found.push_back("threw " + thrown);
          ++reads;
          if (const known_gap* g = gap_of(r.name, w)) {
            INFO("known gap: " << g->why);
            CHECK_MESSAGE(!found.empty(), "the known gap is closed: remove it from known_gaps()");
            ++gaps_seen;
            continue;
          }
          CHECK(found.empty());
          for (const auto& f : found) MESSAGE(f);
        }
      }
    }
    INFO("writer " << w.name);
    CHECK(dtypes.size() == w.holds().size());  // every dtype it holds went through it
    CHECK_MESSAGE(exercised, "no output showed what this writer exists to exercise");
  }
  const int cases = static_cast<int>(std::size(topologies) * std::size(save_kinds));
  CHECK(writes == static_cast<int>(ws.size()) * cases);
  CHECK(reads == writes * static_cast<int>(rs.size()));
  MESSAGE(ws.size() << " writers x " << rs.size() << " readers x " << std::size(topologies)
                    << " topologies x " << std::size(save_kinds) << " save shardings: " << writes
                    << " writes, " << reads << " reads (" << gaps_seen << " on known gaps)");
}

TEST_CASE("conformance: a writer's output for the same input is the same bytes on every run") {
  // Native and torch_dist saves name their files by a random save id: it is masked.
  for (std::size_t wi = 0; wi < writers().size(); ++wi) {
    const writer& w = writers()[wi];
    INFO("writer " << w.name);
    std::mt19937 rng(77);
    property_case c = random_case(rng, case_specs(rng, static_cast<int>(wi), 0, w.holds()), 3, 3);
    cairn::memory_storage first, second;
    const std::string id1 = w.write(first, c, 3, layout_kind::block);
    const std::string id2 = w.write(second, c, 3, layout_kind::block);
    CHECK(id1.size() == id2.size());
    auto a = masked_files(first, id1), b = masked_files(second, id2);
    REQUIRE(!a.empty());
    const known_gap* gap = gap_of(same_bytes_check, w);
    if (gap && !gap->always) {
      MESSAGE("not compared, known gap: " << gap->why);
      continue;
    }
    if (gap) {
      INFO("known gap: " << gap->why);
      CHECK_MESSAGE(a != b, "the known gap is closed: remove it from known_gaps()");
      continue;
    }
    CHECK(a.size() == b.size());
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end() && ib != b.end(); ++ia, ++ib) {
      INFO("file " << ia->first);
      CHECK(ia->first == ib->first);
      CHECK(ia->second == ib->second);
    }
  }
}

TEST_CASE("conformance: every dtype has a name in the safetensors and torch tables, both ways") {
  // So safetensors and torch 2.x DCP represent every dtype (the matrix runs each through each
  // writer); a dtype added to all_dtypes without a name fails here. Older formats' gaps are
  // their writers' `cannot_hold`.
  for (cairn::dtype t : cairn::all_dtypes) {
    INFO(std::string(cairn::dtype_name(t)));
    CHECK(cairn::dtype_from_name(cairn::dtype_name(t)) == t);
    CHECK(cairn::torch_zip::dtype_from_torch_name(cairn::torch_zip::torch_dtype_name(t)) == t);
    // A DCP .metadata naming the dtype parses back to it.
    cairn::dcp::metadata m;
    m.state_dict_metadata["x"] = cairn::dcp::tensor_meta{t, {2}, {{{0}, {2}}}};
    m.storage_data.push_back({{"x", cairn::shape{0}, 0}, {"__0_0.distcp", 0, 1}});
    cairn::memory_storage st;
    cairn::dcp::write(st, m).value();
    auto back = cairn::dcp::read(st).value();
    CHECK(std::get<cairn::dcp::tensor_meta>(back.state_dict_metadata.at("x")).type == t);
  }
}

namespace {

/// Expects `r` to have failed with `code`, its message naming `what`.
template <class R>
void check_refused(const R& r, cairn::errc code, const std::string& what) {
  REQUIRE(!r);
  INFO(r.err().describe());
  CHECK(r.err().code == code);
  CHECK(r.err().describe().find(what) != std::string::npos);
}

/// Every way to read a checkpoint refuses the one in `st`, with `code`, naming `what`.
void check_every_reader_refuses(cairn::memory_storage& st,
                                cairn::errc code,
                                const std::string& what) {
  check_refused(cairn::read_any_metadata(st), code, what);
  check_refused(cairn::convert::open_source(st), code, what);
  std::vector<double> buf(2);
  cairn::state_dict sd;
  sd.add("x", cairn::from_rank_offsets("x", std::span(buf), {2}, {}));
  cairn::single_communicator one;
  check_refused(cairn::try_load(sd, st, one), code, what);
}

}  // namespace

TEST_CASE("conformance: a safetensors file naming a dtype cairn has no type for is refused") {
  for (const char* name : {"C64", "F4", "U1"}) {
    INFO(name);
    cairn::memory_storage st;
    std::string header =
        std::string("{\"x\":{\"dtype\":\"") + name + "\",\"shape\":[2],\"data_offsets\":[0,16]}}";
    while (header.size() % 8) header += ' ';
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i)
      file[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    file += header + std::string(16, '\0');
    st.put("model.safetensors", std::as_bytes(std::span(file))).value();
    check_every_reader_refuses(st, cairn::errc::corrupt, name);
  }
}

TEST_CASE("conformance: a DCP checkpoint naming a torch dtype cairn has no type for is refused") {
  // torch.cdouble (complex128) has as many letters as float64: patching a saved .metadata
  // keeps every length in the pickle right.
  cairn::memory_storage st;
  std::vector<double> x = {1.5, -2.0};
  cairn::state_dict sd;
  sd.add("x", cairn::from_rank_offsets("x", std::span(x), {2}, {}));
  cairn::torch_dist_strategy td;
  cairn::save_options so;
  so.strategy = &td;
  cairn::single_communicator one;
  cairn::save(sd, st, one, so);
  auto files = all_files(st);
  auto& meta = files.at(".metadata");
  std::string text(reinterpret_cast<const char*>(meta.data()), meta.size());
  REQUIRE(text.find("float64") != std::string::npos);
  for (std::size_t at; (at = text.find("float64")) != std::string::npos;)
    text.replace(at, 7, "cdouble");
  st.put(".metadata", std::as_bytes(std::span(text))).value();
  check_every_reader_refuses(st, cairn::errc::corrupt, "cdouble");
}

TEST_CASE("conformance: convert refuses a non-floating to_dtype in every format, writing nothing") {
  cairn::memory_storage src_storage;
  std::mt19937 rng(5);
  property_case c = random_case(rng, case_specs(rng, 0, 0, every_dtype), 2, 2);
  save_case(src_storage, c, 2, layout_kind::block, {});
  auto src = cairn::convert::open_source(src_storage).value();
  const auto names = cairn::stream::stream_writer_names();  // every registered format
  CHECK(names.size() >= 6);
  for (const std::string& name : names)
    for (cairn::dtype t : cairn::all_dtypes) {
      if (cv::convertible_float(t)) continue;
      INFO(name << " to " << std::string(cairn::dtype_name(t)));
      cairn::memory_storage out;
      cv::convert_options opt;
      opt.writer = name;
      opt.to_dtype = t;
      check_refused(cv::convert(*src, out, opt), cairn::errc::invalid_argument,
                    std::string(cairn::dtype_name(t)));
      CHECK(out.list("").value().empty());
    }
}

TEST_CASE("conformance: a writer refuses each dtype its format cannot represent, naming it") {
  int refusals = 0;
  for (const writer& w : writers())
    for (cairn::dtype t : w.cannot_hold) {
      INFO("writer " << w.name << ", dtype " << std::string(cairn::dtype_name(t)));
      std::mt19937 rng(9);
      property_case c = random_case(rng, {{"x", t, {3, 2}}}, 2, 2);
      cairn::memory_storage out;
      std::string thrown = what_throws([&] { w.write(out, c, 2, layout_kind::block); });
      ++refusals;
      if (const known_gap* g = gap_of(refuses_check, w)) {
        INFO("known gap: " << g->why);
        CHECK_MESSAGE(thrown.empty(), "the known gap is closed: remove it from known_gaps()");
        continue;
      }
      CHECK(thrown.find(std::string(cairn::errc_name(cairn::errc::invalid_argument))) == 0);
      CHECK((thrown.find(std::string(cairn::dtype_name(t))) != std::string::npos ||
             thrown.find(std::string(cairn::torch_zip::torch_dtype_name(t))) != std::string::npos));
      CHECK(out.list("").value().empty());
    }
  CHECK(refusals > 0);
}
