// HttpFrontend: the OpenAI-compatible HTTP/1.1 listener of infoflow-server
// (--http-listen; docs/DESIGN.md §14), on cpp-httplib.
//
//   POST /v1/completions        prompt "prefix # # chunk # # ... # # question"
//   POST /v1/chat/completions   the same convention in the last user message
//   GET  /v1/models             the served model
//   GET  /health                200 while serving, 503 once shutting down
//
// It only translates: a request body becomes a gRPC QueryRequest
// (openai_request.h) and runs through the same PrepareQuery / ExecuteQuery
// as the gRPC Query (server/services.h), so it shares the scheduler (one
// engine loop), the limits, the auth token (Authorization: Bearer), the
// metrics and the log line. Errors are OpenAI's JSON shape with the HTTP
// status of http_errors.h's table. stream=true answers with Server-Sent
// Events ("data: {...}" per token, then "data: [DONE]"); an error after the
// stream has begun arrives as a "data: {"error": ...}" event.
//
// Thread-safe; requests run on its own thread pool.
#ifndef INFOFLOW_SERVER_HTTP_HTTP_FRONTEND_H_
#define INFOFLOW_SERVER_HTTP_HTTP_FRONTEND_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/services.h"

namespace infoflow::server::http {

struct HttpFrontendOptions {
  std::string listen;                 // "host:port"; port 0 = ephemeral
  std::string blend_separator = " # # ";
  // auto (the model's chat template, ServiceDeps::chat_template, else
  // detected from tokenizer_config.json / model_type) | template | qwen |
  // llama3 | mistral | glm4 | plain
  std::string chat_format = "auto";
  std::string model_dir;              // auto without a template: its tokenizer_config.json
  uint64_t max_body_bytes = uint64_t{16} << 20;  // larger bodies: 413 before they are read
  // Connections served at once, each on its own thread (started on demand;
  // past this many, new connections wait for one to close).
  int max_connections = 512;
  // Each request's line, headers and body must arrive within this of its
  // first byte, else the connection is closed (server/http/http_listener.h).
  int64_t request_timeout_ms = 30000;
};

class HttpFrontend {
 public:
  // Binds `options.listen` and serves on its own threads until Shutdown.
  // `deps` must outlive the frontend. InvalidArgument for a bad address,
  // separator or chat format; Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(const ServiceDeps* deps,
                                                             const HttpFrontendOptions& options);
  // Shuts down at once (cancelling running requests) if not yet done.
  ~HttpFrontend();
  HttpFrontend(const HttpFrontend&) = delete;
  HttpFrontend& operator=(const HttpFrontend&) = delete;

  int port() const;  // the bound port
  const std::string& chat_format() const;  // the format chat requests are rendered in

  // Graceful shutdown, phase 1: new requests get 503 and /health 503;
  // running ones continue. Idempotent.
  void BeginShutdown();
  // Phase 2: waits until the running requests finish or `deadline` passes,
  // then cancels the rest (their queries stop at the next step), closes the
  // listener and joins its threads. Idempotent; calls BeginShutdown.
  void FinishShutdown(std::chrono::steady_clock::time_point deadline);

 private:
  struct Impl;
  explicit HttpFrontend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_HTTP_FRONTEND_H_
