// The stream writer registry (format/stream/writers.hpp): the built-in writers by name and
// alias, what each holds, the error naming every writer, a name clash refused, and the number
// settings' parser.
#include "cairn/format/stream/writers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cairn/convert/unshard.hpp"

TEST_CASE("the built-in stream writers are found by name and by alias") {
  const auto names = cairn::stream::stream_writer_names();
  for (const char* n : {"chunks", "native", "one_file", "per_tensor", "torch_dist"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  CHECK(std::is_sorted(names.begin(), names.end()));
  const auto name_of = [](const char* n) {
    return cairn::stream::find_stream_writer(n).value()->name;
  };
  CHECK(name_of("cairn") == "native");
  CHECK(name_of("dcp") == "torch_dist");
  CHECK(name_of("torch") == "torch_dist");
  CHECK(name_of("safetensors") == "one_file");
  const auto* native = cairn::stream::find_stream_writer("native").value();
  CHECK(native->format == "cairn");
  CHECK((native->holds_objects && native->holds_commons && !native->whole_tensors));
  const auto* chunks = cairn::stream::find_stream_writer("chunks").value();
  CHECK(chunks->format == "safetensors");
  CHECK((!chunks->holds_objects && !chunks->holds_commons && chunks->whole_tensors));
  CHECK(chunks->settings == std::vector<std::string>{"chunk_size"});
  CHECK(cairn::stream::find_stream_writer("torch_dist").value()->settings ==
        std::vector<std::string>{"flavor"});
}

TEST_CASE("an unknown stream writer is named with every writer there is") {
  auto r = cairn::stream::find_stream_writer("hdf5");
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::not_found);
  CHECK(r.err().message.find("'hdf5'") != std::string::npos);
  CHECK(r.err().message.find("native or cairn") != std::string::npos);
  CHECK(r.err().message.find("torch_dist or dcp or torch") != std::string::npos);
}

TEST_CASE("a stream writer may not take a name another writer has") {
  cairn::stream::stream_writer w;
  w.name = "test_writers_clash";
  w.aliases = {"dcp"};
  auto r = cairn::stream::register_stream_writer(w);
  REQUIRE(!r);
  CHECK(r.err().code == cairn::errc::already_exists);
  CHECK(r.err().message.find("torch_dist") != std::string::npos);
  CHECK(!cairn::stream::find_stream_writer("test_writers_clash"));
  w.aliases = {};
  CHECK(cairn::stream::register_stream_writer(w).value());
  CHECK(cairn::stream::register_stream_writer(w).value());  // again: replaced
  CHECK(cairn::stream::find_stream_writer("test_writers_clash").value()->name == w.name);
}

TEST_CASE("a number setting is a whole number of bytes, nothing else") {
  CHECK(cairn::stream::detail::parse_count("chunk_size", "4096").value() == 4096);
  for (const char* bad : {"", "-1", "12kb", "1e6", " 5", "99999999999999999999999"}) {
    INFO(bad);
    auto r = cairn::stream::detail::parse_count("chunk_size", bad);
    REQUIRE(!r);
    CHECK(r.err().code == cairn::errc::invalid_argument);
    CHECK(r.err().message.find("chunk_size") != std::string::npos);
  }
}
