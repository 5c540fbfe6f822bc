// cairn's SigV4 signatures equal the AWS SDK signer's (@smithy/signature-v4) for the same
// requests, and objects cairn wrote read back with the AWS SDK client (@aws-sdk/client-s3).
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cairn/storage/s3.hpp"
#include "tests/storage/conformance.hpp"
#include "tests/system/s3/s3_server.hpp"

using namespace cairn_storage_test;
using namespace cairn_s3_test;

namespace {

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

struct sig_case {
  std::string method, name;
  std::vector<std::pair<std::string, std::string>> query, headers;
  std::string body;
};

void skip_without_node() {
  std::string why = skip_reason();
  if (!why.empty()) {
    std::printf("SKIP: %s\n", why.c_str());
    std::fflush(stdout);
    std::_Exit(0);
  }
}

}  // namespace

TEST_CASE("SigV4 signatures equal the AWS SDK signer's") {
  skip_without_node();
  const std::string date = "20250102T030405Z";
  std::vector<sig_case> cases{
      {"GET", "a/b.bin", {}, {{"Range", "bytes=0-99"}}, ""},
      {"PUT", "m.json", {}, {}, "{\"x\": 1}"},
      {"PUT", "dir with space/f (1).bin", {}, {}, "payload"},
      {"POST", "big.bin", {{"uploads", ""}}, {}, ""},
      {"PUT", "big.bin", {{"partNumber", "3"}, {"uploadId", "a/b+c=d e~f"}}, {}, "part"},
      {"POST", "big.bin", {{"uploadId", "x y/z"}}, {}, "<CompleteMultipartUpload/>"},
      {"DELETE", "big.bin", {{"uploadId", "id/with/slashes"}}, {}, ""},
      {"GET",
       "",
       {{"list-type", "2"},
        {"prefix", "ckpt/step 10/"},
        {"max-keys", "1000"},
        {"continuation-token", "1/2+3=="}},
       {},
       ""},
      {"HEAD", "ü/é~.bin", {}, {}, ""},
      {"GET", "x", {{"b", "2"}, {"a", "1"}, {"A", "0"}}, {{"Range", "bytes=5-  9"}}, ""},
  };
  for (bool token : {false, true}) {
    for (bool path_style : {true, false}) {
      CAPTURE(token);
      CAPTURE(path_style);
      cairn::s3_options o;
      o.endpoint = path_style ? "http://127.0.0.1:9000" : "";
      o.region = "eu-west-3";
      o.access_key = "AKIDEXAMPLE";
      o.secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
      o.session_token = token ? "FQoGZXIvYXdzEJr//////////wEaDOTOKEN" : "";
      cairn::s3_storage s("s3://my-bucket/pre fix", o);
      std::ostringstream js;
      js << "{\"region\":\"eu-west-3\",\"credentials\":{\"accessKeyId\":\"AKIDEXAMPLE\","
         << "\"secretAccessKey\":\"" << o.secret_key << "\""
         << (token ? ",\"sessionToken\":" + json_str(o.session_token) : "") << "},\"requests\":[";
      std::vector<std::string> mine;
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        auto body = std::as_bytes(std::span(c.body));
        auto sig = s.sign_for_test(c.method, c.name, c.query, c.headers, body, date);
        mine.push_back(sig.signature);
        // The host and path cairn sends, from its own canonical request.
        std::istringstream cr(sig.canonical);
        std::string method, path;
        std::getline(cr, method);
        std::getline(cr, path);
        std::string host = path_style ? "127.0.0.1:9000" : "my-bucket.s3.eu-west-3.amazonaws.com";
        js << (i ? "," : "") << "{\"method\":" << json_str(c.method)
           << ",\"host\":" << json_str(host) << ",\"path\":" << json_str(path)
           << ",\"date\":" << json_str(date) << ",\"query\":{";
        for (std::size_t q = 0; q < c.query.size(); ++q)
          js << (q ? "," : "") << json_str(c.query[q].first) << ":" << json_str(c.query[q].second);
        js << "},\"headers\":{\"x-amz-content-sha256\":"
           << json_str(cairn::detail::sigv4::payload_hash(body));
        for (const auto& [k, v] : c.headers) js << "," << json_str(k) << ":" << json_str(v);
        js << "}}";
      }
      js << "]}";
      temp_dir dir;
      std::string spec = (dir.path / "spec.json").string();
      std::ofstream(spec) << js.str();
      std::string out =
          run(node_env() + "node '" + script("sigv4_reference.cjs") + "' '" + spec + "'");
      std::istringstream lines(out);
      for (std::size_t i = 0; i < cases.size(); ++i) {
        std::string ref;
        std::getline(lines, ref);
        CAPTURE(i);
        CAPTURE(cases[i].method);
        CAPTURE(cases[i].name);
        CHECK(mine[i] == ref);
      }
    }
  }
  // The canonical query of a multipart create is "uploads=", and '/' and ' ' are encoded.
  CHECK(cairn::detail::sigv4::canonical_query({{"uploads", ""}}) == "uploads=");
  CHECK(cairn::detail::sigv4::canonical_query({{"prefix", "a b/c"}, {"list-type", "2"}}) ==
        "list-type=2&prefix=a%20b%2Fc");
}

TEST_CASE("objects cairn wrote read back with the AWS SDK client") {
  skip_without_node();
  s3rver srv;
  cairn::s3_options o = options_for(srv.endpoint());
  cairn::s3_storage s("s3://" + srv.bucket + "/sdk", o);
  std::map<std::string, bytes> written{
      {"small.bin", pattern(1000, 1)},
      {"dir/x y.bin", pattern(10, 2)},
      {"empty.bin", {}},
  };
  for (const auto& [n, b] : written) require_ok(s.put(n, b));
  bytes big = pattern((std::size_t{3} << 20) + 77, 3);  // a multipart upload (1 MiB parts)
  auto w = s.open_writer("multi/part.bin");
  require_ok((*w)->write_at(0, big));
  require_ok((*w)->finish());
  written["multi/part.bin"] = big;
  CHECK(s.counters().multipart_completed == 1);

  std::string out = run(node_env() + "node '" + script("sdk_read.cjs") + "' " + srv.endpoint() +
                        " " + srv.bucket + " sdk/");
  std::map<std::string, std::pair<std::size_t, std::string>> sdk;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto a = line.rfind(' '), b = line.rfind(' ', a - 1);
    sdk[line.substr(0, b)] = {std::stoull(line.substr(b + 1, a - b - 1)), line.substr(a + 1)};
  }
  REQUIRE(sdk.size() == written.size());
  for (const auto& entry : written) {
    const auto& n = entry.first;  // CAPTURE's lambda: no structured binding before clang 16
    const auto& b = entry.second;
    CAPTURE(n);
    auto it = sdk.find("sdk/" + n);
    REQUIRE(it != sdk.end());
    CHECK(it->second.first == b.size());
    CHECK(it->second.second == cairn::detail::sigv4::payload_hash(b));
  }
}
