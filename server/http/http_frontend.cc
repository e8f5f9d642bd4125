#include "server/http/http_frontend.h"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/model.h"
#include "server/http/blend_prompt.h"
#include "server/http/http_errors.h"
#include "server/http/http_listener.h"
#include "server/http/openai_request.h"
#include "server/http/openai_response.h"
#include "server/metrics.h"
#include "server/quoted_value.h"
#include "server/token_limit.h"

namespace infoflow::server::http {

using nlohmann::json;
namespace v1 = ::infoflow::v1;

namespace {

constexpr char kJson[] = "application/json";
// Connections the kernel holds for the listener before it accepts them
// (http_listener.h: the library's 5 made bursts wait seconds).
constexpr int kListenBacklog = 1024;
// Request line plus headers (nginx's default allows 4 x 8 KiB lines; the
// library caps one line at 8 KiB but not their number).
constexpr size_t kMaxRequestHeadBytes = 64 << 10;
// Bodies of all requests in flight: this many of the largest at once.
constexpr uint64_t kBodiesInFlight = 16;

// What a request may take to arrive (http_listener.h). A body as sent may
// be the limit plus room for chunked framing (a chunk's size line and CRLFs:
// 8% of 64-byte chunks); a Content-Length over the limit is refused (413) by
// the library before any of it is read, so this bounds chunked bodies.
RequestLimits Limits(const HttpFrontendOptions& o) {
  RequestLimits l;
  l.timeout = std::chrono::milliseconds(std::max<int64_t>(1, o.request_timeout_ms));
  l.max_head_bytes = kMaxRequestHeadBytes;
  l.max_body_bytes = static_cast<size_t>(o.max_body_bytes + o.max_body_bytes / 4 + (64 << 10));
  l.max_inflight_body_bytes = static_cast<size_t>(kBodiesInFlight * o.max_body_bytes);
  return l;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void SetError(httplib::Response& res, const HttpError& e) {
  res.status = e.http_status;
  // Busy (429: queue full) and shutting down (503): when to come back. The
  // openai SDKs read it for their automatic retries.
  if (e.http_status == 429 || e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(ErrorBody(e), kJson);
}

void LogHttp(const httplib::Request& req, int status, const std::string& error) {
  // Path and error carry client text: one line each, bounded.
  std::fprintf(stderr, "http=%s path=%s status=%d%s%s\n", PrintableText(req.method, 16).c_str(),
               PrintableText(req.path, 256).c_str(), status,
               error.empty() ? "" : " error=", PrintableText(error, 1024).c_str());
}

}  // namespace

struct HttpFrontend::Impl {
  Impl(const ServiceDeps* deps, const HttpFrontendOptions& o)
      : d(deps),
        options(o),
        limits(Limits(o)),
        server(limits, ErrorBody(CutShortError(RequestFailure::kListenerFull)),
               [this](const std::string& peer, RequestFailure why) { OnDropped(peer, why); }) {}

  const ServiceDeps* d = nullptr;
  HttpFrontendOptions options;
  const RequestLimits limits;
  RequestContext ctx;
  RequestDeadlineServer server;
  std::thread listener;
  int port = 0;
  int64_t started_at = 0;

  std::atomic<bool> draining{false};    // BeginShutdown: refuse new requests
  std::atomic<bool> cancel_all{false};  // past the grace: stop running queries
  std::mutex mu;
  std::condition_variable cv;
  int active = 0;  // requests between admission and their last byte
  std::once_flag finish_once;

  // Leave() on scope exit; shared by a streaming response's provider.
  struct ActiveGuard {
    Impl* impl;
    ~ActiveGuard() { impl->Leave(); }
    ActiveGuard(const ActiveGuard&) = delete;
    ActiveGuard& operator=(const ActiveGuard&) = delete;
  };

  // Counts a request for graceful shutdown; false when shutting down.
  bool Enter() {
    std::lock_guard<std::mutex> l(mu);
    if (draining.load()) return false;
    ++active;
    return true;
  }
  void Leave() {
    std::lock_guard<std::mutex> l(mu);
    --active;
    cv.notify_all();
  }

  // The answer to a request the listener cut short (http_listener.h), or
  // whose Content-Length the library refused (kBodyTooLarge): one table for
  // the status, the error body and the log line.
  HttpError CutShortError(RequestFailure why) const {
    HttpError e;
    switch (why) {
      case RequestFailure::kNone:
        break;
      case RequestFailure::kDeadline:
        e = ErrorFromStatus(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request not received whole within ", limits.timeout.count(),
                         " ms of its first byte (--http-request-timeout-ms)"));
        e.http_status = 408;
        e.code = "request_timeout";
        break;
      case RequestFailure::kHeadTooLarge:
        e = ErrorFromStatus(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("headers: request line and headers over ",
                                         limits.max_head_bytes, " bytes"));
        e.http_status = 431;
        e.code = "headers_too_large";
        break;
      case RequestFailure::kBodyTooLarge:
        e = ErrorFromStatus(grpc::StatusCode::INVALID_ARGUMENT,
                            "body: the request body is over the server's limit "
                            "(--http-max-body-bytes)");
        e.http_status = 413;
        e.param = "body";
        e.code = "request_too_large";
        break;
      case RequestFailure::kBodiesBudget:
        e = ErrorFromStatus(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("server: request bodies in flight over ", limits.max_inflight_body_bytes,
                         " bytes (", kBodiesInFlight, " x --http-max-body-bytes); retry later"));
        e.code = "server_busy";
        break;
      case RequestFailure::kListenerFull:
        e = ErrorFromStatus(grpc::StatusCode::UNAVAILABLE,
                            "server: every HTTP connection slot is busy; retry later");
        e.code = "server_busy";
        break;
    }
    return e;
  }

  // A connection closed for how it sent its request: counted, and logged
  // unless the listener was full (a flood would flood the log).
  void OnDropped(const std::string& peer, RequestFailure why) {
    if (d->metrics != nullptr) d->metrics->AddHttpRequestDropped(RequestFailureName(why));
    if (why == RequestFailure::kListenerFull) return;
    std::fprintf(stderr, "http connection from %s closed: %s\n", peer.c_str(),
                 CutShortError(why).message.c_str());
  }

  absl::Status CheckAuth(const httplib::Request& req) const {
    if (!req.has_header("Authorization")) return CheckBearerToken(nullptr, d->auth_token);
    const std::string value = req.get_header_value("Authorization");
    return CheckBearerToken(&value, d->auth_token);
  }

  void Routes();
  void HandleQuery(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void Respond(const OpenAiRequest& r, const QuerySpec& spec, httplib::Response& res,
               const std::string& origin);
  // Streams a query that holds `place` in the scheduler's queue.
  bool Stream(const OpenAiRequest& r, const QuerySpec& spec, Scheduler::Place* place,
              httplib::DataSink& sink, const std::string& origin);
};

namespace {

// The route a request path counts under (a bounded set of metric labels).
const char* RouteLabel(const std::string& path) {
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}) {
    if (path == route) return route;
  }
  if (absl::StartsWith(path, "/v1/models/")) return "/v1/models/{model}";
  return "other";
}

}  // namespace

void HttpFrontend::Impl::Routes() {
  // Every response the library writes, error handler's included (a stream
  // counts its 200 when it ends). The listener's own 503 (no thread) is
  // infoflow_http_requests_dropped_total instead.
  server.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (d->metrics != nullptr) d->metrics->CountHttpResponse(RouteLabel(req.path), res.status);
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool up = !draining.load();
    res.status = up ? 200 : 503;
    res.set_content(Dump({{"status", up ? "ok" : "shutting_down"}}), kJson);
  });
  auto models = [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::Status s = CheckAuth(req); !s.ok()) {
      SetError(res, ErrorFromStatus(s));
      LogHttp(req, res.status, std::string(s.message()));
      return;
    }
    const json model = {{"id", d->model_name}, {"object", "model"}, {"created", started_at},
                        {"owned_by", "infoflow-kv"}};
    if (req.matches.size() > 1) {
      if (req.matches[1].str() != d->model_name) {
        HttpError e =
            ErrorFromStatus(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("model: the model ", QuotedValue(req.matches[1].str()),
                                         " does not exist"));
        e.code = "model_not_found";
        SetError(res, e);
        return;
      }
      res.set_content(Dump(model), kJson);
      return;
    }
    res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), kJson);
  };
  server.Get("/v1/models", models);
  server.Get(R"(/v1/models/([^/]+))", models);
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleQuery(req, res, Endpoint::kCompletions);
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleQuery(req, res, Endpoint::kChatCompletions);
  });
  // Statuses set by the library itself (unknown path 404, body over the
  // limit 413, unreadable request 400) get an OpenAI error body too.
  server.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const RequestFailure cut = RequestDeadlineServer::CurrentRequestFailure();
    HttpError e;
    e.http_status = res.status;
    e.type = "invalid_request_error";
    if (cut != RequestFailure::kNone) {  // the listener cut the request short
      e = CutShortError(cut);
    } else if (res.status == 413) {  // the library, from Content-Length
      e = CutShortError(RequestFailure::kBodyTooLarge);
    } else if (res.status == 404) {
      e.message = absl::StrCat("no route for ", req.method, " ", req.path);
      e.code = "not_found";
    } else {
      e.message = absl::StrCat("HTTP ", res.status);
      if (res.status >= 500) e.type = "server_error";
    }
    SetError(res, e);
    LogHttp(req, res.status, e.message);
  });
  server.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        HttpError e = ErrorFromStatus(grpc::StatusCode::INTERNAL, "internal error: " + what);
        SetError(res, e);
        LogHttp(req, res.status, e.message);
      });
}

void HttpFrontend::Impl::HandleQuery(const httplib::Request& req, httplib::Response& res,
                                     Endpoint endpoint) {
  if (!Enter()) {
    SetError(res, ErrorFromStatus(grpc::StatusCode::UNAVAILABLE, "server: shutting down"));
    LogHttp(req, res.status, "shutting down");
    return;
  }
  // Not make_shared(ActiveGuard{this}): that temporary's destructor would Leave() too.
  std::shared_ptr<ActiveGuard> guard(new ActiveGuard{this});
  // Every check before any work, in the order a client can fix them.
  if (absl::Status s = CheckAuth(req); !s.ok()) {
    SetError(res, ErrorFromStatus(s));
    LogHttp(req, res.status, std::string(s.message()));
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(req.body, endpoint, ctx);
  if (!parsed.ok()) {
    HttpError e = ErrorFromStatus(parsed.status());
    if (absl::IsNotFound(parsed.status())) e.code = "model_not_found";
    SetError(res, e);
    LogHttp(req, res.status, e.message);
    return;
  }
  auto r = std::make_shared<OpenAiRequest>(*std::move(parsed));
  auto spec = std::make_shared<QuerySpec>();
  // A prompt without the separator is a plain prompt (ChunkPolicy).
  bool token_limit = false;
  if (grpc::Status s = PrepareQuery(*d, r->query, ChunkPolicy::kOptional, spec.get(), &token_limit);
      !s.ok()) {
    SetError(res, QueryError(*r, s, token_limit));
    LogQuery(absl::StrCat("http=", req.path), r->query.chunks_size(), *spec, s,
             absl::UnknownError("not run"));
    return;
  }
  spec->fit_new_tokens = r->max_tokens_default;
  const std::string origin = absl::StrCat("http=", req.path);
  if (!r->stream) {
    Respond(*r, *spec, res, origin);
    return;
  }
  // Admission before the 200: once the stream's headers are out, a full
  // queue could only be an error event, which OpenAI clients do not retry
  // as they retry a 429. Members go in reverse order: the place is given
  // back (if unused) before the guard lets a shutdown proceed.
  struct StreamHold {
    std::shared_ptr<ActiveGuard> guard;
    Scheduler::Place place;
  };
  auto hold = std::make_shared<StreamHold>();
  hold->guard = std::move(guard);
  if (grpc::Status s = ReserveQueryPlace(*d, &hold->place); !s.ok()) {
    SetError(res, QueryError(*r, s, /*token_limit=*/false));
    LogQuery(origin, r->query.chunks_size(), *spec, s, absl::UnknownError("not run"));
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream",
                                   [this, r, spec, hold, origin](size_t, httplib::DataSink& sink) {
                                     const bool ok = Stream(*r, *spec, &hold->place, sink, origin);
                                     if (ok) sink.done();
                                     return ok;  // false: the connection is closed
                                   });
}

void HttpFrontend::Impl::Respond(const OpenAiRequest& r, const QuerySpec& spec,
                                 httplib::Response& res, const std::string& origin) {
  QueryStreamIo io;
  // The whole text comes back in the outcome. A client that closed its
  // connection cancels the query (polled with the scheduler's wait).
  io.write_token = [](int32_t, std::string_view) { return true; };
  io.cancelled = [this] { return cancel_all.load() || RequestDeadlineServer::ClientGone(); };
  io.deadline_passed = [] { return false; };
  QueryRun run = ExecuteQuery(*d, spec, io);
  LogQuery(origin, r.query.chunks_size(), spec, run.status, run.outcome);
  if (!run.status.ok()) {
    SetError(res, QueryError(r, run.status, IsTokenLimitError(run.outcome.status())));
    return;
  }
  json report;
  if (r.report) {
    v1::Report rep;
    FillReport(spec, *run.outcome, &rep);
    report = ReportJson(rep);
  }
  const ResponseId rid = NewResponseId(r.endpoint, r.model);
  res.set_content(Dump(CompletionResponse(rid, spec, *run.outcome, report)), kJson);
}

bool HttpFrontend::Impl::Stream(const OpenAiRequest& r, const QuerySpec& spec,
                                Scheduler::Place* place, httplib::DataSink& sink,
                                const std::string& origin) {
  const ResponseId rid = NewResponseId(r.endpoint, r.model);
  bool client_gone = false;
  auto send = [&](const std::string& bytes) {
    if (!client_gone && !sink.write(bytes.data(), bytes.size())) client_gone = true;
    return !client_gone;
  };
  auto last_write = std::chrono::steady_clock::now();
  if (r.endpoint == Endpoint::kChatCompletions) send(SseEvent(StreamChunk(rid, "", nullptr, true)));
  QueryStreamIo io;
  io.write_token = [&](int32_t, std::string_view text) {
    if (text.empty()) return true;  // bytes of a character not yet complete
    last_write = std::chrono::steady_clock::now();
    return send(SseEvent(StreamChunk(rid, text, nullptr)));
  };
  // While queued or prefilling nothing is written, so a client that left
  // would go unnoticed: an SSE comment each second finds out.
  io.cancelled = [&] {
    if (cancel_all.load() || client_gone) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_write > std::chrono::seconds(1)) {
      last_write = now;
      send(": keep-alive\n\n");
    }
    return client_gone;
  };
  io.deadline_passed = [] { return false; };
  QueryRun run = ExecuteQuery(*d, spec, io, place);
  LogQuery(origin, r.query.chunks_size(), spec, run.status, run.outcome);
  if (client_gone) return false;
  if (!run.status.ok()) {
    // The 200 and its headers are out: the error is the stream's last event.
    const HttpError e = QueryError(r, run.status, IsTokenLimitError(run.outcome.status()));
    send("data: " + ErrorBody(e) + "\n\n");
    return send(kSseDone);
  }
  const QueryOutcome& out = *run.outcome;
  json last = StreamChunk(rid, "", FinishReason(out.stop_reason));
  if (r.report) {
    v1::Report rep;
    FillReport(spec, out, &rep);
    last["infoflow"] = ReportJson(rep);
  }
  send(SseEvent(last));
  if (r.include_usage) send(SseEvent(StreamUsageChunk(rid, Usage(spec, out))));
  return send(kSseDone);
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const ServiceDeps* deps, const HttpFrontendOptions& options) {
  auto impl = std::make_unique<Impl>(deps, options);
  if (options.blend_separator.empty()) {
    return absl::InvalidArgumentError("--blend-separator: must not be empty");
  }
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen: expected HOST:PORT, got '", options.listen, "'"));
  }
  const std::string host = options.listen.substr(0, colon);
  if (options.chat_format == "template" && deps->chat_template == nullptr) {
    return absl::InvalidArgumentError(
        "--http-chat-format template: the model directory has no usable chat template "
        "(tokenizer_config.json chat_template or chat_template.jinja)");
  }
  if ((options.chat_format == "auto" || options.chat_format == "template") &&
      deps->chat_template != nullptr) {
    impl->ctx.chat_format = TemplateChatFormat(deps->chat_template);
  } else if (options.chat_format == "auto") {
    impl->ctx.chat_format = DetectChatFormat(
        ReadTextFile((std::filesystem::path(options.model_dir) / "tokenizer_config.json").string()),
        deps->model->config().model_type);
  } else {
    absl::StatusOr<ChatFormat> f = FindChatFormat(options.chat_format);
    if (!f.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-chat-format: '", options.chat_format,
          "' (auto, template, qwen, llama3, mistral, glm4, plain)"));
    }
    impl->ctx.chat_format = *f;
  }
  impl->ctx.model_name = deps->model_name;
  impl->ctx.separator = options.blend_separator;
  impl->ctx.max_new_tokens = deps->options->max_new_tokens;
  impl->started_at = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();

  httplib::Server& s = impl->server;
  // A thread per connection, started as they come (http_listener.h).
  // As many more may wait for one; past that a connection gets 503 at once.
  const size_t threads = static_cast<size_t>(std::max(2, options.max_connections));
  s.new_task_queue = [threads] { return new ElasticThreadPool(threads, threads); };
  s.set_payload_max_length(options.max_body_bytes);
  s.set_keep_alive_timeout(2);  // bounds how long an idle connection delays shutdown
  s.set_read_timeout(10);       // a client that stops sending its body is dropped
  s.set_write_timeout(10);      // a reader that stops reading is dropped (query cancelled)
  impl->Routes();
  if (port == 0) {
    impl->port = s.bind_to_any_port(host);
    if (impl->port <= 0) {
      return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": cannot bind"));
    }
  } else {
    if (!s.bind_to_port(host, port)) {
      return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": cannot bind"));
    }
    impl->port = port;
  }
  if (!impl->server.WidenListenBacklog(kListenBacklog)) {
    return absl::UnavailableError(
        absl::StrCat("--http-listen ", options.listen, ": cannot listen: ", std::strerror(errno)));
  }
  Impl* raw = impl.get();
  impl->listener = std::thread([raw] { raw->server.listen_after_bind(); });
  return std::unique_ptr<HttpFrontend>(new HttpFrontend(std::move(impl)));
}

HttpFrontend::HttpFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpFrontend::~HttpFrontend() { FinishShutdown(std::chrono::steady_clock::now()); }

int HttpFrontend::port() const { return impl_->port; }
const std::string& HttpFrontend::chat_format() const { return impl_->ctx.chat_format.name; }

void HttpFrontend::BeginShutdown() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->draining = true;
}

void HttpFrontend::FinishShutdown(std::chrono::steady_clock::time_point deadline) {
  BeginShutdown();
  std::call_once(impl_->finish_once, [&] {
    Impl& m = *impl_;
    {
      std::unique_lock<std::mutex> l(m.mu);
      if (!m.cv.wait_until(l, deadline, [&] { return m.active == 0; })) {
        m.cancel_all = true;  // running queries stop at their next step
        m.cv.wait(l, [&] { return m.active == 0; });
      }
    }
    m.server.stop();
    if (m.listener.joinable()) m.listener.join();
  });
}

}  // namespace infoflow::server::http
