// A small synchronous C++ client for infoflow-server (proto/infoflow/v1).
// One Client wraps one channel; it is safe to use from several threads.
#ifndef INFOFLOW_CLIENT_CLIENT_H_
#define INFOFLOW_CLIENT_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "infoflow/v1/infoflow.grpc.pb.h"

namespace infoflow::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50051";
  std::string token;            // sent as "authorization: Bearer <token>" when set
  bool tls = false;             // connect with TLS
  std::string tls_root_certs;   // PEM roots; empty = system roots
  int64_t timeout_ms = 0;       // per-call deadline; 0 = none
};

// Reads a bearer token from `path` (surrounding whitespace stripped).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Hex hash of a query's chunk list (keys and texts, in order), sent as the
// `x-infoflow-chunkset` header so a consistent-hash proxy routes equal chunk
// sets to the same replica.
std::string ChunkSetHash(const ::infoflow::v1::QueryRequest& request);

class Client {
 public:
  explicit Client(const ClientOptions& options);

  absl::StatusOr<infoflow::v1::IngestResponse> Ingest(const infoflow::v1::IngestRequest& request);

  // Sends every batch on one IngestStream call; `on_response` gets each
  // batch's response in order (so a caller that retries knows which batches
  // are left: a suffix of `batches`).
  absl::Status IngestStream(
      absl::Span<const infoflow::v1::IngestRequest> batches,
      const std::function<void(const infoflow::v1::IngestResponse&)>& on_response);

  // Streams tokens to `on_token`; returns the final report (empty when the
  // request did not ask for one). A grpc error becomes the absl status with
  // the same code.
  absl::StatusOr<infoflow::v1::Report> Query(
      const infoflow::v1::QueryRequest& request,
      const std::function<void(const infoflow::v1::TokenEvent&)>& on_token);

  absl::StatusOr<infoflow::v1::StatsResponse> Stats();
  absl::StatusOr<infoflow::v1::ModelInfoResponse> ModelInfo();

 private:
  void Prepare(grpc::ClientContext* ctx) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<infoflow::v1::ChunkIngest::Stub> ingest_;
  std::unique_ptr<infoflow::v1::Query::Stub> query_;
  std::unique_ptr<infoflow::v1::Admin::Stub> admin_;
};

}  // namespace infoflow::client

#endif  // INFOFLOW_CLIENT_CLIENT_H_
