// Tests of cairn/storage/s3/writer.hpp: s3_writer's choice between one PUT and a multipart
// upload, parts uploaded as soon as they are complete, holes zero-filled, the completion request,
// misuse, and failures (a part refused, no UploadId, no ETag, an error inside a 200 answer, a
// dropped writer) that abort the upload. A scripted S3 records every request; s3rver checks that
// nothing becomes visible before finish().
#include "cairn/storage/s3/writer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cairn/storage/s3/storage.hpp"
#include "tests/storage/s3/scripted_server.hpp"
#include "tests/system/s3/s3_server.hpp"

namespace writer_test {

/// A multipart-capable scripted S3 with faults to switch on.
struct fake_s3 {
  std::mutex mu;
  std::map<int, std::string> parts;       // part number -> body
  std::vector<std::string> part_uploads;  // uploadId parameter of each UploadPart
  std::string object;                     // what the last PUT or completion made
  int creates = 0, puts = 0, completes = 0, aborts = 0;
  int fail_part = 0;               // this part number answers 403
  bool no_upload_id = false;       // CreateMultipartUpload answers without <UploadId>
  bool no_etag = false;            // UploadPart answers without ETag
  bool error_in_complete = false;  // CompleteMultipartUpload answers 200 with <Error>

  cairn_s3_unit::http_reply answer(const cairn_s3_unit::http_request& r) {
    std::lock_guard lock(mu);
    cairn_s3_unit::http_reply rep;
    if (r.method == "POST" && r.has_param("uploads")) {
      ++creates;
      rep.body = no_upload_id ? "<InitiateMultipartUploadResult/>"
                              : "<InitiateMultipartUploadResult><UploadId>up/1+x&amp;"
                                "</UploadId></InitiateMultipartUploadResult>";
    } else if (r.method == "PUT" && r.has_param("partNumber")) {
      const int n = std::stoi(r.param("partNumber"));
      part_uploads.push_back(r.param("uploadId"));
      if (n == fail_part) return {403, {}, cairn_s3_unit::error_xml("AccessDenied", "no"), "", 0};
      parts[n] = r.body;
      if (!no_etag) rep.headers = {{"ETag", "\"etag-" + std::to_string(n) + "\""}};
    } else if (r.method == "POST" && r.has_param("uploadId")) {
      ++completes;
      if (error_in_complete)
        return {200, {}, cairn_s3_unit::error_xml("InternalError", "try again"), "", 0};
      auto numbers = cairn::detail::xml_all(r.body, "PartNumber");
      auto etags = cairn::detail::xml_all(r.body, "ETag");
      object.clear();
      for (std::size_t i = 0; i < numbers.size(); ++i) {
        const int n = std::stoi(numbers[i]);
        if (n != static_cast<int>(i) + 1 || etags.at(i) != "\"etag-" + numbers[i] + "\"")
          return {400, {}, cairn_s3_unit::error_xml("InvalidPart", numbers[i]), "", 0};
        object += parts.at(n);
      }
      rep.body = "<CompleteMultipartUploadResult/>";
    } else if (r.method == "DELETE" && r.has_param("uploadId")) {
      ++aborts;
      rep.status = 204;
    } else if (r.method == "PUT") {
      ++puts;
      object = r.body;
    } else {
      rep.status = 400;
    }
    return rep;
  }
};

/// A fake S3 served on 127.0.0.1 and a client of it with parts of 100 bytes.
struct rig {
  fake_s3 s3;
  cairn_s3_unit::scripted_server srv{
      [this](const cairn_s3_unit::http_request& r) { return s3.answer(r); }};
  std::shared_ptr<cairn::detail::s3_client> client = [this] {
    cairn::s3_options o = cairn_s3_unit::unit_options(srv.endpoint());
    o.part_size = 100;
    o.allow_small_parts = true;  // the fake accepts them
    return std::make_shared<cairn::detail::s3_client>("bkt", "pre", o);
  }();
  std::unique_ptr<cairn::detail::s3_writer> writer(const std::string& name = "obj.bin") {
    return std::make_unique<cairn::detail::s3_writer>(client, name);
  }
};

inline std::span<const std::byte> span_of(const std::string& s) {
  return std::as_bytes(std::span(s));
}

}  // namespace writer_test

TEST_SUITE("s3_writer") {
  TEST_CASE("an object that never fills a part is one PUT, with its holes zero-filled") {
    writer_test::rig r;
    auto w = r.writer();
    REQUIRE(w->write_at(50, writer_test::span_of("bbb")).has_value());
    REQUIRE(w->write_at(0, writer_test::span_of("aaa")).has_value());
    CHECK(r.srv.requests().empty());  // nothing goes up before finish()
    REQUIRE(w->finish().has_value());
    CHECK(r.s3.object == "aaa" + std::string(47, '\0') + "bbb");
    CHECK(r.s3.puts == 1);
    CHECK(r.s3.creates == 0);
    CHECK(r.srv.requests().at(0).path == "/bkt/pre/obj.bin");
    CHECK(r.client->counters().puts == 1);
    CHECK(r.client->counters().bytes_put == 53);

    auto empty = r.writer("empty.bin");
    REQUIRE(empty->finish().has_value());
    CHECK(r.s3.object.empty());
    CHECK(r.s3.puts == 2);
  }

  TEST_CASE("each part goes up once complete, the rest on finish, then one completion") {
    writer_test::rig r;
    auto w = r.writer();
    // One whole part in one call: uploaded at once, from the caller's memory.
    const std::string p1(100, '1');
    REQUIRE(w->write_at(0, writer_test::span_of(p1)).has_value());
    CHECK(r.s3.creates == 1);
    CHECK(r.s3.parts.size() == 1);
    // Parts 2 and 3 from unaligned pieces written backwards; [120, 140) is never written.
    std::string want = p1;
    want.resize(250, '\0');
    for (std::uint64_t off = 240; off >= 140; off -= 20) {
      std::string piece(std::min<std::uint64_t>(20, 250 - off), static_cast<char>('a' + off / 20));
      want.replace(off, piece.size(), piece);
      REQUIRE(w->write_at(off, writer_test::span_of(piece)).has_value());
    }
    REQUIRE(w->write_at(100, writer_test::span_of(want.substr(100, 20))).has_value());
    CHECK(r.s3.parts.size() == 1);  // part 2 has its hole, part 3 is the short last one
    REQUIRE(w->finish().has_value());
    CHECK(r.s3.object == want);
    CHECK(r.s3.parts.at(3).size() == 50);
    CHECK(r.s3.completes == 1);
    CHECK(r.s3.puts == 0);
    CHECK(r.s3.aborts == 0);
    // Every part names the upload S3 gave, decoded from its XML and encoded again.
    CHECK(r.s3.part_uploads == std::vector<std::string>(3, "up%2F1%2Bx%26"));
    auto c = r.client->counters();
    CHECK(c.parts == 3);
    CHECK(c.bytes_put == 250);
    CHECK(c.multipart_completed == 1);
    CHECK(c.multipart_aborted == 0);
  }

  TEST_CASE("misuse: overflowing ranges, writes after finish, rewriting a part sent") {
    writer_test::rig r;
    auto w = r.writer();
    auto over = w->write_at(UINT64_MAX - 1, writer_test::span_of("xy"));
    REQUIRE(!over);
    CHECK(over.err().code == cairn::errc::invalid_argument);
    CHECK(over.err().message == "write range overflows on s3://bkt/pre/obj.bin");
    CHECK(over.err().file == "s3://bkt/pre/obj.bin");
    // S3 holds 10,000 parts per object: with parts of 100 bytes, nothing past byte 1,000,000.
    auto too_far = w->write_at(1'000'000, writer_test::span_of("x"));
    REQUIRE(!too_far);
    CHECK(too_far.err().code == cairn::errc::invalid_argument);
    CHECK(too_far.err().message.find("10,000 parts of 100 bytes") != std::string::npos);
    REQUIRE(w->write_at(0, writer_test::span_of("x")).has_value());  // not a sticky failure
    REQUIRE(w->finish().has_value());
    auto late = w->write_at(0, writer_test::span_of("x"));
    REQUIRE(!late);
    CHECK(late.err().message.find("write_at after finish()") != std::string::npos);
    auto twice = w->finish();
    REQUIRE(!twice);
    CHECK(twice.err().message.find("finish() called twice") != std::string::npos);
    CHECK(r.s3.puts == 1);

    auto w2 = r.writer("two.bin");
    REQUIRE(w2->write_at(0, writer_test::span_of(std::string(100, 'a'))).has_value());
    auto overlap = w2->write_at(50, writer_test::span_of("b"));
    REQUIRE(!overlap);
    CHECK(overlap.err().code == cairn::errc::invalid_argument);
    CHECK(overlap.err().message.find("part 1 after it was complete") != std::string::npos);
    CHECK(overlap.err().offset == 50);
    // That writer is broken now: finish() reports it and aborts the upload.
    auto fin = w2->finish();
    REQUIRE(!fin);
    CHECK(fin.err().code == cairn::errc::invalid_argument);
    CHECK(r.s3.aborts == 1);
    CHECK(r.s3.completes == 0);
  }

  TEST_CASE("a refused part fails the writer at its offset, and finish aborts the upload") {
    writer_test::rig r;
    r.s3.fail_part = 2;
    auto w = r.writer();
    auto e = w->write_at(0, writer_test::span_of(std::string(250, 'z')));
    REQUIRE(!e);
    CHECK(e.err().code == cairn::errc::io);
    CHECK(e.err().offset == 100);  // where part 2 begins
    CHECK(e.err().file == "s3://bkt/pre/obj.bin");
    CHECK(e.err().message.find("S3 UploadPart of key \"pre/obj.bin\"") != std::string::npos);
    CHECK(e.err().message.find("HTTP status 403 AccessDenied") != std::string::npos);
    // Later calls give the same failure without sending anything.
    const auto sent = r.srv.requests().size();
    auto again = w->write_at(300, writer_test::span_of("x"));
    REQUIRE(!again);
    CHECK(again.err().message == e.err().message);
    CHECK(r.srv.requests().size() == sent);
    auto fin = w->finish();
    REQUIRE(!fin);
    CHECK(fin.err().message == e.err().message);
    CHECK(r.s3.aborts == 1);
    CHECK(r.s3.completes == 0);
    CHECK(r.client->counters().multipart_aborted == 1);
    CHECK(r.client->counters().multipart_completed == 0);
  }

  TEST_CASE("no UploadId, no ETag, or an error inside a 200 completion fail the writer") {
    {
      writer_test::rig r;
      r.s3.no_upload_id = true;
      auto w = r.writer();
      auto e = w->write_at(0, writer_test::span_of(std::string(100, 'a')));
      REQUIRE(!e);
      CHECK(e.err().code == cairn::errc::io);
      CHECK(e.err().message ==
            "S3 CreateMultipartUpload of key \"pre/obj.bin\" returned no UploadId");
      CHECK(!w->finish());
      CHECK(r.s3.aborts == 0);  // there is no upload to abort
    }
    {
      writer_test::rig r;
      r.s3.no_etag = true;
      auto w = r.writer();
      auto e = w->write_at(0, writer_test::span_of(std::string(100, 'a')));
      REQUIRE(!e);
      CHECK(e.err().message == "S3 UploadPart of key \"pre/obj.bin\" returned no ETag");
      CHECK(!w->finish());
      CHECK(r.s3.aborts == 1);
    }
    {
      writer_test::rig r;
      r.s3.error_in_complete = true;
      auto w = r.writer();
      REQUIRE(w->write_at(0, writer_test::span_of(std::string(150, 'a'))).has_value());
      auto fin = w->finish();
      REQUIRE(!fin);
      CHECK(fin.err().code == cairn::errc::io);
      CHECK(fin.err().message.find("CompleteMultipartUpload") != std::string::npos);
      CHECK(fin.err().message.find("InternalError: try again") != std::string::npos);
      CHECK(r.s3.completes == 3);  // retried: S3 may send an error in a 200 answer
      CHECK(r.s3.aborts == 1);
      CHECK(r.client->counters().multipart_completed == 0);
    }
  }

  TEST_CASE("a dropped writer aborts its upload, and one without an upload sends nothing") {
    writer_test::rig r;
    {
      auto w = r.writer();
      REQUIRE(w->write_at(0, writer_test::span_of(std::string(120, 'a'))).has_value());
    }
    CHECK(r.s3.aborts == 1);
    CHECK(r.client->counters().multipart_aborted == 1);
    const auto sent = r.srv.requests().size();
    {
      auto w = r.writer("small.bin");
      REQUIRE(w->write_at(0, writer_test::span_of("a")).has_value());
    }
    CHECK(r.srv.requests().size() == sent);
    CHECK(r.s3.puts == 0);
  }

  TEST_CASE("on a real S3 server an unfinished or dropped writer leaves the old object readable") {
    if (cairn_s3_test::skipped()) return;
    cairn_s3_test::s3rver srv;
    cairn::s3_options o = cairn_s3_test::options_for(srv.endpoint());
    o.part_size = 5 << 20;
    cairn::s3_storage s("s3://" + srv.bucket + "/w", o);
    const std::string old_text = "old contents";
    REQUIRE(s.put("x.bin", writer_test::span_of(old_text)).has_value());
    const std::string big((5 << 20) + 10, 'n');
    {
      auto w = s.open_writer("x.bin");
      REQUIRE(w.has_value());
      REQUIRE((*w)->write_at(0, writer_test::span_of(big)).has_value());  // part 1 is up
      CHECK(s.counters().parts == 1);
      CHECK(s.size("x.bin").value() == old_text.size());
    }
    CHECK(s.counters().multipart_aborted == 1);
    CHECK(s.size("x.bin").value() == old_text.size());
    auto w = s.open_writer("x.bin");
    REQUIRE((*w)->write_at(0, writer_test::span_of(big)).has_value());
    CHECK(s.size("x.bin").value() == old_text.size());
    REQUIRE((*w)->finish().has_value());
    CHECK(s.size("x.bin").value() == big.size());
    std::vector<std::byte> tail(10);
    REQUIRE(s.read("x.bin", 5 << 20, tail).has_value());
    CHECK(std::string(reinterpret_cast<const char*>(tail.data()), 10) == std::string(10, 'n'));
  }
}
