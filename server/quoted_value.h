// Client-supplied text as error messages and log lines show it.
#ifndef INFOFLOW_SERVER_QUOTED_VALUE_H_
#define INFOFLOW_SERVER_QUOTED_VALUE_H_

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace infoflow::server {

// `text` cut to at most `max_bytes` bytes (at a UTF-8 character boundary,
// then "... (N bytes)"), with control bytes written as \n, \r, \t or \xNN so
// that it stays on one line: a request must not be able to write a line of
// its own into the server's one-line-per-request log.
inline std::string PrintableText(std::string_view text, size_t max_bytes) {
  size_t cut = text.size();
  if (cut > max_bytes) {
    cut = max_bytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  }
  std::string out;
  out.reserve(cut + 24);
  for (size_t i = 0; i < cut; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
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
      out += static_cast<char>(c);
    }
  }
  if (cut < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// A value the client sent, quoted for an error message: PrintableText cut to
// 64 bytes. gRPC carries a status message in the response's metadata, which
// clients refuse past their 8-16 KiB limit ("received initial metadata size
// exceeds limit"): a long value echoed whole replaced the error that names the
// field with one that names nothing, and broke the client's channel for its
// next call.
inline std::string QuotedValue(std::string_view value, size_t max_bytes = 64) {
  if (value.size() <= max_bytes) return "'" + PrintableText(value, max_bytes) + "'";
  std::string s = PrintableText(value, max_bytes);
  const size_t tail = s.rfind("... (");
  return "'" + s.substr(0, tail) + "...'" + s.substr(tail + 3);
}

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUOTED_VALUE_H_
