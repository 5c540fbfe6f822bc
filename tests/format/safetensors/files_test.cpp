// How tensors are spread over safetensors files (format/safetensors/files.hpp): file names, the
// one_file / per_tensor / chunks plans, size limits and collisions, and the index of a plan.
#include "cairn/format/safetensors/files.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace safetensors_files_test {

namespace sf = cairn::safetensors;

/// Names of the tensors of each planned file.
inline std::vector<std::vector<std::string>> layout(const std::vector<sf::planned_file>& files) {
  std::vector<std::vector<std::string>> out;
  for (const auto& f : files) {
    out.emplace_back();
    for (const auto& t : f.tensors) out.back().push_back(t.name);
  }
  return out;
}

}  // namespace safetensors_files_test

TEST_CASE("safetensors file names: per tensor and numbered chunks") {
  namespace sf = cairn::safetensors;
  CHECK(sf::per_tensor_name("w") == "w.safetensors");
  CHECK(sf::per_tensor_name("layers/0/attn.w") == "layers-0-attn.w.safetensors");
  CHECK(sf::per_tensor_name("../etc/passwd") == "..-etc-passwd.safetensors");  // no directories
  CHECK(sf::chunk_name(0, 1) == "model-00001-of-00001.safetensors");
  CHECK(sf::chunk_name(11, 12) == "model-00012-of-00012.safetensors");
  CHECK(sf::chunk_name(99999, 123456) == "model-100000-of-123456.safetensors");
}

TEST_CASE("plan_files: one_file and per_tensor keep the given order") {
  namespace sf = cairn::safetensors;
  using L = std::vector<std::vector<std::string>>;
  std::vector<sf::tensor_decl> all{
      {"z", cairn::dtype::f32, {2}}, {"a/b", cairn::dtype::i8, {3}}, {"m", cairn::dtype::f64, {}}};
  auto one = sf::plan_files(all, sf::file_split::one_file, 0).value();
  REQUIRE(one.size() == 1);
  CHECK(one[0].name == "model.safetensors");
  CHECK(safetensors_files_test::layout(one) == L{{"z", "a/b", "m"}});

  auto per = sf::plan_files(all, sf::file_split::per_tensor, 0).value();
  REQUIRE(per.size() == 3);
  CHECK(per[1].name == "a-b.safetensors");
  CHECK(safetensors_files_test::layout(per) == L{{"z"}, {"a/b"}, {"m"}});

  // Two keys that map to one file name are refused, naming the second key.
  all.push_back({"a-b", cairn::dtype::f32, {1}});
  auto clash = sf::plan_files(all, sf::file_split::per_tensor, 0);
  REQUIRE(!clash);
  CHECK(clash.err().code == cairn::errc::invalid_argument);
  CHECK(clash.err().key == "a-b");
  CHECK(clash.err().message.find("a-b.safetensors") != std::string::npos);

  CHECK(sf::plan_files({}, sf::file_split::per_tensor, 0).value().empty());
}

TEST_CASE("plan_files: chunks fill files up to chunk_size, a larger tensor alone") {
  namespace sf = cairn::safetensors;
  using L = std::vector<std::vector<std::string>>;
  // Bytes: a 40, b 40, c 20, big 400, d 0, e 60.
  std::vector<sf::tensor_decl> all{
      {"a", cairn::dtype::f32, {10}},   {"b", cairn::dtype::f32, {10}},
      {"c", cairn::dtype::f32, {5}},    {"big", cairn::dtype::f64, {50}},
      {"d", cairn::dtype::f32, {0, 3}}, {"e", cairn::dtype::i16, {30}}};
  auto files = sf::plan_files(all, sf::file_split::chunks, 100).value();
  // a+b+c = 100 fits exactly; big gets a file of its own (already over the limit, so the empty
  // d starts the next), and e joins d.
  CHECK(safetensors_files_test::layout(files) == L{{"a", "b", "c"}, {"big"}, {"d", "e"}});
  REQUIRE(files.size() == 3);
  for (std::size_t i = 0; i < files.size(); ++i) CHECK(files[i].name == sf::chunk_name(i, 3));

  // Deterministic for a tensor list.
  auto again = sf::plan_files(all, sf::file_split::chunks, 100).value();
  CHECK(safetensors_files_test::layout(again) == safetensors_files_test::layout(files));

  // One byte less per file and c moves on.
  CHECK(safetensors_files_test::layout(sf::plan_files(all, sf::file_split::chunks, 99).value()) ==
        L{{"a", "b"}, {"c"}, {"big"}, {"d", "e"}});

  auto zero = sf::plan_files(all, sf::file_split::chunks, 0);
  REQUIRE(!zero);
  CHECK(zero.err().code == cairn::errc::invalid_argument);

  // A shape whose byte count overflows is refused by name.
  std::vector<sf::tensor_decl> huge{{"ok", cairn::dtype::f32, {1}},
                                    {"huge", cairn::dtype::f64, {1ll << 40, 1ll << 40}}};
  auto r = sf::plan_files(huge, sf::file_split::chunks, 100);
  REQUIRE(!r);
  CHECK(r.err().key == "huge");
  std::vector<sf::tensor_decl> negative{{"neg", cairn::dtype::f32, {-1}}};
  auto n = sf::plan_files(negative, sf::file_split::chunks, 100);
  REQUIRE(!n);
  CHECK(n.err().key == "neg");
}

TEST_CASE("index_of names each tensor's file and totals the tensor bytes") {
  namespace sf = cairn::safetensors;
  std::vector<sf::tensor_decl> all{{"a", cairn::dtype::f32, {10}},
                                   {"b", cairn::dtype::bf16, {4, 4}},
                                   {"c", cairn::dtype::u8, {7}}};
  auto files = sf::plan_files(all, sf::file_split::chunks, 64).value();
  REQUIRE(files.size() == 2);
  auto ix = sf::index_of(files).value();
  CHECK(ix.total_size == 40 + 32 + 7);
  CHECK(ix.weight_map.at("a") == files[0].name);
  CHECK(ix.weight_map.at("b") == files[1].name);
  CHECK(ix.weight_map.at("c") == files[1].name);
  CHECK(ix.extra_metadata.empty());

  CHECK(sf::index_of({}).value().weight_map.empty());

  // A file that cannot be laid out (a name the format reserves, a duplicate) fails.
  std::vector<sf::planned_file> bad{{"x.safetensors", {{"__metadata__", cairn::dtype::f32, {1}}}}};
  CHECK(!sf::index_of(bad));
  std::vector<sf::planned_file> dup{
      {"x.safetensors", {{"t", cairn::dtype::f32, {1}}, {"t", cairn::dtype::f32, {1}}}}};
  auto d = sf::index_of(dup);
  REQUIRE(!d);
  CHECK(d.err().key == "t");
}
