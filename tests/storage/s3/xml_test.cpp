// Tests of cairn/storage/s3/xml.hpp: entity decoding (named, numeric as UTF-8, malformed ones kept
// as written), element texts of S3 answers including hostile XML, and escaping of request bodies.
#include "cairn/storage/s3/xml.hpp"

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

TEST_SUITE("s3 xml") {
  TEST_CASE("xml_unescape decodes the named and numeric entities") {
    using cairn::detail::xml_unescape;
    CHECK(xml_unescape("a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos;") == "a & b <c> \"d\" 'e'");
    // Numeric references become UTF-8 of 1, 2, 3 and 4 bytes, at each length's boundaries.
    CHECK(xml_unescape("&#65;&#x42;&#X43;") == "ABC");
    CHECK(xml_unescape("&#x7F;") == "\x7f");
    CHECK(xml_unescape("&#x80;") == "\xc2\x80");
    CHECK(xml_unescape("&#233;&#xE9;") == "\xc3\xa9\xc3\xa9");
    CHECK(xml_unescape("&#x7FF;") == "\xdf\xbf");
    CHECK(xml_unescape("&#x800;") == "\xe0\xa0\x80");
    CHECK(xml_unescape("&#x20AC;") == "\xe2\x82\xac");
    CHECK(xml_unescape("&#xFFFF;") == "\xef\xbf\xbf");
    CHECK(xml_unescape("&#x10000;") == "\xf0\x90\x80\x80");
    CHECK(xml_unescape("&#x1F600;") == "\xf0\x9f\x98\x80");
    CHECK(xml_unescape("&#x10FFFF;") == "\xf4\x8f\xbf\xbf");
    // "&amp;lt;" is decoded once.
    CHECK(xml_unescape("&amp;lt;") == "&lt;");
  }

  TEST_CASE("xml_unescape keeps unknown, unterminated and malformed entities as written") {
    using cairn::detail::xml_unescape;
    for (const char* kept : {"AT&T",
                             "a & b",
                             "&",
                             "&;",
                             "&nbsp;",
                             "&AMP;",
                             "&#;",
                             "&#x;",
                             "&#0;",
                             "&#x0;",
                             "&#-1;",
                             "&#+65;",
                             "&#x-41;",
                             "&#12abc;",
                             "&#x41 ;",
                             "&# 65;",
                             "&#xD800;",
                             "&#xDFFF;",
                             "&#x110000;",
                             "&#xFFFFFFFFFFFF;",
                             "&#99999999999999999999999;",
                             "&#x0041z;"}) {
      CAPTURE(kept);
      std::string out = xml_unescape(kept);
      CHECK(out == kept);
      CHECK(out.find('\0') == std::string::npos);  // a hostile server cannot put NUL in a key
    }
    // A ';' far away does not swallow what lies between.
    CHECK(xml_unescape("a & b; c &amp; d") == "a & b; c & d");
  }

  TEST_CASE("xml_all and xml_first return the decoded texts of an element") {
    const std::string list =
        "<?xml version=\"1.0\"?><ListBucketResult><KeyCount>3</KeyCount>"
        "<Contents><Key>p/a &amp; b.bin</Key><Size>1</Size></Contents>"
        "<Contents><Key></Key></Contents>"
        "<Contents><Key>p/&#xFC;/&lt;x&gt;</Key></Contents>"
        "<IsTruncated>true</IsTruncated><NextContinuationToken>1/2+3==</NextContinuationToken>"
        "</ListBucketResult>";
    using cairn::detail::xml_all;
    using cairn::detail::xml_first;
    CHECK(xml_all(list, "Key") == std::vector<std::string>{"p/a & b.bin", "", "p/\xc3\xbc/<x>"});
    CHECK(xml_first(list, "KeyCount") == "3");  // <Key> is not a prefix match of <KeyCount>
    CHECK(xml_first(list, "IsTruncated") == "true");
    CHECK(xml_first(list, "NextContinuationToken") == "1/2+3==");
    CHECK(xml_first(list, "UploadId").empty());
    CHECK(xml_all(list, "Missing").empty());
    CHECK(xml_first("", "Code").empty());
  }

  TEST_CASE("hostile XML: unclosed, attributed, self-closed and escaped tags") {
    using cairn::detail::xml_all;
    using cairn::detail::xml_first;
    // An element that is never closed ends the scan; what came before it stays.
    CHECK(xml_all("<Key>a</Key><Key>b", "Key") == std::vector<std::string>{"a"});
    CHECK(xml_first("<Code>SlowDown", "Code").empty());
    // Only exact "<tag>" opens an element: attributes and self-closing tags are not it.
    CHECK(xml_all("<Key a=\"1\">x</Key><Key/><Key>y</Key>", "Key") ==
          std::vector<std::string>{"y"});
    // Escaped markup inside a message is text, never an element.
    const std::string err =
        "<Error><Message>&lt;Code&gt;Evil&lt;/Code&gt;</Message><Code>NoSuchKey</Code></Error>";
    CHECK(xml_first(err, "Code") == "NoSuchKey");
    CHECK(xml_first(err, "Message") == "<Code>Evil</Code>");
    // A closing tag before the opening one is no element.
    CHECK(xml_all("</Key>x<Key>", "Key").empty());
    // Many elements: every one comes back, in order.
    std::string many;
    for (int i = 0; i < 5000; ++i) many += "<Key>" + std::to_string(i) + "</Key>";
    auto all = xml_all(many, "Key");
    REQUIRE(all.size() == 5000);
    CHECK(all[4999] == "4999");
  }

  TEST_CASE("xml_escape output decodes back to the input, whatever the bytes") {
    CHECK(cairn::detail::xml_escape("\"a\" & <b> 'c'") == "&quot;a&quot; &amp; &lt;b&gt; 'c'");
    std::mt19937 rng(7);
    const std::string alphabet = "&;#x<>\"'aZ09 \xc3\xa9/";
    for (int round = 0; round < 500; ++round) {
      std::string s;
      for (std::size_t n = rng() % 24; n > 0; --n) s += alphabet[rng() % alphabet.size()];
      CAPTURE(s);
      std::string esc = cairn::detail::xml_escape(s);
      CHECK(esc.find('<') == std::string::npos);
      CHECK(cairn::detail::xml_unescape(esc) == s);
      // And as the text of an element (an ETag in CompleteMultipartUpload).
      CHECK(cairn::detail::xml_first("<ETag>" + esc + "</ETag>", "ETag") == s);
    }
  }
}
