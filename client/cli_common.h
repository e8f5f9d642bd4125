// Connection flags shared by the gRPC subcommands (ingest, query, stats).
#ifndef INFOFLOW_CLIENT_CLI_COMMON_H_
#define INFOFLOW_CLIENT_CLI_COMMON_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace infoflow::cli {

// Value flags every client subcommand accepts.
inline const std::set<std::string> kConnectFlags = {"server", "token-file", "tls-ca", "timeout-ms"};
inline constexpr char kConnectUsage[] =
    "  --server ADDR        host:port of infoflow-server (default 127.0.0.1:50051)\n"
    "  --token-file F       bearer token for a server started with --auth-token-file\n"
    "  --tls-ca F           connect with TLS, trusting the PEM roots in F\n"
    "  --timeout-ms N       per-call deadline (default none)\n";

// Builds ClientOptions from those flags' values (empty = not given).
absl::StatusOr<client::ClientOptions> MakeClientOptions(const std::string& server,
                                                        const std::string& token_file,
                                                        const std::string& tls_ca,
                                                        const std::string& timeout_ms);

}  // namespace infoflow::cli

#endif  // INFOFLOW_CLIENT_CLI_COMMON_H_
