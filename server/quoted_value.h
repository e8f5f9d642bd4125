// QuotedValue: a client-supplied value as an error message shows it.
#ifndef INFOFLOW_SERVER_QUOTED_VALUE_H_
#define INFOFLOW_SERVER_QUOTED_VALUE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace infoflow::server {

// `value` in single quotes, cut to at most `max_bytes` bytes (at a UTF-8
// character boundary) and then followed by "... (N bytes)". gRPC carries a
// status message in the response's metadata, which clients refuse past their
// 8-16 KiB limit ("received initial metadata size exceeds limit"): a long
// value echoed whole would replace the error that names the field with one
// that names nothing, and break the client's channel for its next calls.
inline std::string QuotedValue(std::string_view value, size_t max_bytes = 64) {
  if (value.size() <= max_bytes) return "'" + std::string(value) + "'";
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80) --cut;
  return "'" + std::string(value.substr(0, cut)) + "...' (" + std::to_string(value.size()) +
         " bytes)";
}

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUOTED_VALUE_H_
