// cairn/storage/s3/xml.hpp: the little XML that S3 answers need: the texts of an element
// (ListObjectsV2 keys, UploadId, error <Code> and <Message>) and escaping for request bodies
// (CompleteMultipartUpload). Not a general XML parser: no attributes, no nesting of equal tags.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::detail {

/// `s` with its XML entities decoded: the five named ones and numeric ones (`&#233;`, `&#xE9;`,
/// written as UTF-8); an unknown, unterminated or malformed entity (no digits, other characters,
/// NUL, a surrogate, past U+10FFFF) is kept as written.
inline std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (ent.starts_with('#')) {
      // Digits only (hex after 'x'), naming a Unicode scalar value other than NUL; anything else
      // ("&#;", "&#-1;", "&#12ab;", a surrogate, past U+10FFFF) is kept as written.
      const bool hex = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X');
      const std::string_view digits = ent.substr(hex ? 2 : 1);
      unsigned long cp = 0;
      bool valid = !digits.empty();
      for (char c : digits) {
        int d = c >= '0' && c <= '9'          ? c - '0'
                : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
                : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                              : -1;
        if (d < 0 || cp > 0x10FFFF) {
          valid = false;
          break;
        }
        cp = cp * (hex ? 16 : 10) + static_cast<unsigned long>(d);
      }
      if (!valid || cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        out.append(s.substr(i, semi - i + 1));
      } else if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

/// The decoded texts of every <tag>...</tag> in `xml`, in order.
inline std::vector<std::string> xml_all(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  std::size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    pos += open.size();
    std::size_t end = xml.find(close, pos);
    if (end == std::string_view::npos) break;
    out.push_back(xml_unescape(xml.substr(pos, end - pos)));
    pos = end + close.size();
  }
  return out;
}

/// The decoded text of the first <tag>...</tag> in `xml`; empty when absent.
inline std::string xml_first(std::string_view xml, std::string_view tag) {
  auto all = xml_all(xml, tag);
  return all.empty() ? std::string() : all.front();
}

/// Escapes text for an XML element.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace cairn::detail
