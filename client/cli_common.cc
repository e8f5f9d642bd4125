#include "client/cli_common.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace infoflow::cli {

absl::StatusOr<client::ClientOptions> MakeClientOptions(const std::string& server,
                                                        const std::string& token_file,
                                                        const std::string& tls_ca,
                                                        const std::string& timeout_ms) {
  client::ClientOptions o;
  if (!server.empty()) o.address = server;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> t = client::ReadTokenFile(token_file);
    if (!t.ok()) return t.status();
    o.token = *t;
  }
  if (!tls_ca.empty()) {
    std::ifstream in(tls_ca);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--tls-ca: cannot read ", tls_ca));
    std::stringstream ss;
    ss << in.rdbuf();
    o.tls = true;
    o.tls_root_certs = ss.str();
  }
  if (!timeout_ms.empty() && (!absl::SimpleAtoi(timeout_ms, &o.timeout_ms) || o.timeout_ms < 0)) {
    return absl::InvalidArgumentError("--timeout-ms: expected a non-negative integer");
  }
  return o;
}

}  // namespace infoflow::cli
