// Client-supplied text as error messages and log lines show it.
#ifndef INFOFLOW_SERVER_QUOTED_VALUE_H_
#define INFOFLOW_SERVER_QUOTED_VALUE_H_

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace infoflow::server {

// How many bytes of `text` fit in `max_bytes` without splitting a UTF-8
// character.
inline size_t Utf8Cut(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

// `text` with control bytes written as \n, \r, \t or \xNN, so that it stays on
// one line: a request must not be able to write a line of its own into the
// server's one-line-per-request log.
inline std::string EscapeControlBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out;
}

// `text` escaped and cut to at most `max_bytes` of its bytes, then
// "... (N bytes)" when cut.
inline std::string PrintableText(std::string_view text, size_t max_bytes) {
  const size_t cut = Utf8Cut(text, max_bytes);
  std::string out = EscapeControlBytes(text.substr(0, cut));
  if (cut < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// A value the client sent, quoted for an error message: escaped and cut to
// `max_bytes`, then "...' (N bytes)" when cut. gRPC carries a status message
// in the response's metadata, which clients refuse past their 8-16 KiB limit
// ("received initial metadata size exceeds limit"): a long value echoed whole
// replaced the error that names the field with one that names nothing, and
// broke the client's channel for its next call.
inline std::string QuotedValue(std::string_view value, size_t max_bytes = 64) {
  const size_t cut = Utf8Cut(value, max_bytes);
  const std::string shown = "'" + EscapeControlBytes(value.substr(0, cut));
  if (cut == value.size()) return shown + "'";
  return shown + "...' (" + std::to_string(value.size()) + " bytes)";
}

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUOTED_VALUE_H_
