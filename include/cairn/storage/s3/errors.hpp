// cairn/storage/s3/errors.hpp: what of a server's answer may go into an error message: credential
// material redacted, length bounded, control characters removed, error codes checked for shape.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "cairn/storage/s3/sigv4.hpp"

namespace cairn::detail {

/// Longest text a server (or libcurl) contributes to one error message, in bytes.
inline constexpr std::size_t max_server_text = 300;

inline constexpr std::string_view redaction_mark = "[redacted]";

/// Replaces every occurrence of `what` in `text` with the redaction mark.
inline void redact_all(std::string& text, std::string_view what) {
  if (what.empty()) return;
  for (std::size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + redaction_mark.size()))
    text.replace(at, what.size(), redaction_mark);
}

/// Redacts `secret` in `text`: whole, percent-encoded, and any piece of it at least 16 characters
/// long (a truncated echo), grown to the longest match both ways.
inline void redact_secret(std::string& text, const std::string& secret) {
  constexpr std::size_t min_piece = 16;
  if (secret.empty()) return;
  redact_all(text, secret);
  redact_all(text, sigv4::uri_encode(secret, false));
  if (secret.size() < min_piece) return;
  for (std::size_t w = 0; w + min_piece <= secret.size(); ++w) {
    std::string_view piece = std::string_view(secret).substr(w, min_piece);
    for (std::size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at)) {
      std::size_t b = at, e = at + min_piece, sb = w, se = w + min_piece;
      while (b > 0 && sb > 0 && text[b - 1] == secret[sb - 1]) --b, --sb;
      while (e < text.size() && se < secret.size() && text[e] == secret[se]) ++e, ++se;
      text.replace(b, e - b, redaction_mark);
      at = b + redaction_mark.size();
    }
  }
}

/// Redacts the values of named credential fields, in any case: from after the name (and, where
/// the name does not end in '=', a ':' or '=' between quotes and spaces) to the end of the value.
inline void redact_named_values(std::string& text) {
  struct named {
    std::string_view name;
    bool needs_separator;  // "name: value", "name=value", "\"name\": \"value\""
    bool stops_at_space;   // the value is one token (else it runs to the end of the line)
  };
  auto is_end = [](char c, bool stops_at_space) {
    return c == '\r' || c == '\n' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '&' ||
           c == '}' || (stops_at_space && (c == ' ' || c == '\t' || c == ',' || c == ';'));
  };
  auto is_gap = [](char c) { return c == '"' || c == '\'' || c == ' ' || c == '\t'; };
  for (const named& n :
       {named{"signature=", false, true}, named{"x-amz-credential=", false, true},
        named{"x-amz-signature", true, true}, named{"x-amz-security-token", true, false},
        named{"authorization", true, false}, named{"aws4-hmac-sha256 credential=", false, false}}) {
    std::string l(text);
    std::transform(l.begin(), l.end(), l.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (std::size_t at = l.find(n.name); at != std::string::npos; at = l.find(n.name, at + 1)) {
      std::size_t b = at + n.name.size();
      if (n.needs_separator) {
        while (b < l.size() && b - at - n.name.size() < 4 && is_gap(l[b])) ++b;
        if (b >= l.size() || (l[b] != ':' && l[b] != '=')) continue;
        ++b;
      }
      for (int gap = 0; b < l.size() && gap < 4 && is_gap(l[b]); ++gap) ++b;
      std::size_t e = b;
      while (e < l.size() && !is_end(l[e], n.stops_at_space)) ++e;
      if (e > b && l.compare(b, e - b, redaction_mark) != 0) {
        text.replace(b, e - b, redaction_mark);
        l.replace(b, e - b, redaction_mark);
      }
    }
  }
}

/// Redacts every run of exactly 64 hex digits (the form of SigV4 signatures).
inline void redact_hex_runs(std::string& text) {
  auto hexdigit = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  };
  for (std::size_t i = 0; i < text.size();) {
    if (!hexdigit(text[i])) {
      ++i;
      continue;
    }
    std::size_t e = i;
    while (e < text.size() && hexdigit(text[e])) ++e;
    if (e - i == 64) {
      text.replace(i, 64, redaction_mark);
      i += redaction_mark.size();
    } else {
      i = e;
    }
  }
}

/// Replaces every occurrence of credential material in `text` with "[redacted]":
/// - each of `secrets` (secret key, session token, signature), also percent-encoded, and any
///   piece of one at least 16 characters long (a truncated echo);
/// - `authorization` (the Authorization header value sent), whole;
/// - the value after "Signature=", "X-Amz-Signature", "X-Amz-Credential=",
///   "x-amz-security-token", "Authorization" (those two followed by ':' or '=') and
///   "AWS4-HMAC-SHA256 Credential=", in any case;
/// - every run of exactly 64 hex digits (the form of SigV4 signatures).
inline std::string redact_credentials(std::string text,
                                      std::span<const std::string> secrets,
                                      std::string_view authorization = {}) {
  redact_all(text, authorization);
  for (const std::string& s : secrets) redact_secret(text, s);
  redact_named_values(text);
  redact_hex_runs(text);
  return text;
}

/// Text from a server or libcurl made fit for an error message: at most 4 KiB looked at,
/// credential material redacted (redact_credentials), control characters turned into spaces,
/// and at most max_server_text bytes kept (cut on a UTF-8 boundary, "..." appended).
inline std::string safe_server_text(std::string_view raw,
                                    std::span<const std::string> secrets,
                                    std::string_view authorization = {}) {
  std::string text = redact_credentials(std::string(raw.substr(0, 4096)), secrets, authorization);
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  if (text.size() > max_server_text || raw.size() > 4096) {
    std::size_t cut = std::min(text.size(), max_server_text);
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

/// An S3 error code (`<Code>`) as sent when it looks like one (letters, digits, '.', '_', '-',
/// at most 64 characters); empty otherwise, so that a hostile server cannot put text there.
inline std::string s3_error_code_of(std::string_view code) {
  if (code.empty() || code.size() > 64) return {};
  for (char c : code) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) return {};
  }
  return std::string(code);
}

}  // namespace cairn::detail
