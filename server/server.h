// InfoflowServer: loads the model and tokenizer, opens the chunk store,
// starts /metrics, the gRPC server (ChunkIngest, Query, Admin, health,
// reflection) and, with --http-listen, the OpenAI-compatible HTTP front end.
// Used by the infoflow-server binary and by tests in-process.
#ifndef INFOFLOW_SERVER_SERVER_H_
#define INFOFLOW_SERVER_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/server_options.h"

namespace infoflow::server {

class InfoflowServer {
 public:
  // Blocks until the server listens. Errors: the model cannot be loaded or
  // generated, the store cannot be opened, a port cannot be bound, or the
  // auth/TLS files cannot be read.
  static absl::StatusOr<std::unique_ptr<InfoflowServer>> Start(const ServerOptions& options);

  // Shuts down (if not yet) and closes the store.
  ~InfoflowServer();
  InfoflowServer(const InfoflowServer&) = delete;
  InfoflowServer& operator=(const InfoflowServer&) = delete;

  int port() const;          // bound gRPC port
  int metrics_port() const;  // bound /metrics port, 0 when disabled
  int http_port() const;     // bound --http-listen port, 0 when disabled
  const std::string& model_dir() const;

  // Stops accepting calls, lets running ones finish for up to `grace`, then
  // cancels the rest; then waits up to --remote-drain-timeout-ms for the
  // shared tier's write-behind and logs each record it could not write.
  // Idempotent.
  void Shutdown(std::chrono::milliseconds grace);
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  struct State;
  explicit InfoflowServer(std::unique_ptr<State> state);
  void DrainRemoteWrites();
  std::unique_ptr<State> s_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_SERVER_H_
