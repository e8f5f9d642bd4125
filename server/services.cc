#include "server/services.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache_store/chunk_store.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_codec.h"
#include "server/group/group_leader.h"
#include "server/quoted_value.h"
#include "server/token_limit.h"

namespace infoflow::server {
namespace v1 = ::infoflow::v1;

namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

grpc::Status Invalid(const std::string& msg) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Length is not secret-dependent in a way worth hiding; contents are.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

grpc::Status CheckModel(const ServiceDeps& d, const v1::ModelSelector& m) {
  if (!m.name().empty() && m.name() != d.model_name) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("model.name: requested ", QuotedValue(m.name()), ", serving '",
                                     d.model_name, "'"));
  }
  if (!m.fingerprint().empty() && m.fingerprint() != d.model->fingerprint()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("model.fingerprint: requested ", QuotedValue(m.fingerprint()),
                                     ", serving ", d.model->fingerprint()));
  }
  return grpc::Status::OK;
}

// UNSPECIFIED is BOS when the model has a bos_token_id, else NONE; an
// explicit BOS on a model without one is refused (no id is made up).
grpc::Status ToPrefixMode(const Model& model, v1::PrefixMode m, PrefixMode* out) {
  const bool has_bos = model.config().bos_token_id.has_value();
  switch (m) {
    case v1::PREFIX_MODE_UNSPECIFIED:
      *out = has_bos ? PrefixMode::kBos : PrefixMode::kNone;
      return grpc::Status::OK;
    case v1::PREFIX_MODE_BOS:
      if (!has_bos) {
        return Invalid(
            "prefix_mode: PREFIX_MODE_BOS, but the model's config.json has no bos_token_id; use "
            "PREFIX_MODE_NONE");
      }
      *out = PrefixMode::kBos;
      return grpc::Status::OK;
    case v1::PREFIX_MODE_NONE:
      *out = PrefixMode::kNone;
      return grpc::Status::OK;
    default:
      return Invalid(absl::StrCat("prefix_mode: unknown value ", static_cast<int>(m)));
  }
}

bool ToMethod(v1::Method m, Method* out) {
  switch (m) {
    case v1::METHOD_UNSPECIFIED: *out = kDefaultMethod; return true;
    case v1::METHOD_INFOFLOW: *out = Method::kInfoFlow; return true;
    case v1::METHOD_FULL: *out = Method::kFull; return true;
    case v1::METHOD_NONE: *out = Method::kNone; return true;
    case v1::METHOD_CACHEBLEND: *out = Method::kCacheBlend; return true;
    case v1::METHOD_EPIC: *out = Method::kEpic; return true;
    case v1::METHOD_RANDOM: *out = Method::kRandom; return true;
    case v1::METHOD_CACHEBLEND_PARTIAL: *out = Method::kCacheBlendPartial; return true;
    case v1::METHOD_INFOFLOW_BLEND: *out = Method::kInfoFlowBlend; return true;
    default: return false;
  }
}

v1::Method FromMethod(Method m) {
  switch (m) {
    case Method::kFull: return v1::METHOD_FULL;
    case Method::kNone: return v1::METHOD_NONE;
    case Method::kInfoFlow: return v1::METHOD_INFOFLOW;
    case Method::kCacheBlend: return v1::METHOD_CACHEBLEND;
    case Method::kEpic: return v1::METHOD_EPIC;
    case Method::kRandom: return v1::METHOD_RANDOM;
    case Method::kCacheBlendPartial: return v1::METHOD_CACHEBLEND_PARTIAL;
    case Method::kInfoFlowBlend: return v1::METHOD_INFOFLOW_BLEND;
  }
  return v1::METHOD_UNSPECIFIED;
}

v1::RemoteState ToRemoteState(store::RemoteWriteState s) {
  switch (s) {
    case store::RemoteWriteState::kNotConfigured: return v1::REMOTE_STATE_NOT_CONFIGURED;
    case store::RemoteWriteState::kUnknown: return v1::REMOTE_STATE_UNSPECIFIED;
    case store::RemoteWriteState::kPending: return v1::REMOTE_STATE_PENDING;
    case store::RemoteWriteState::kWritten: return v1::REMOTE_STATE_WRITTEN;
    case store::RemoteWriteState::kFailed: return v1::REMOTE_STATE_FAILED;
  }
  return v1::REMOTE_STATE_UNSPECIFIED;
}

void LogLine(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Engine code may throw (torch errors); a request must fail, not the process.
template <typename F>
auto GuardedRun(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("engine error: ", e.what()));
  }
}

bool DeadlinePassed(const grpc::ServerContext* ctx) {
  return std::chrono::system_clock::now() > ctx->deadline();
}

// Translates and validates a QueryRequest; messages name the field.
grpc::Status ToSpec(const ServiceDeps& d, const v1::QueryRequest& req, ChunkPolicy chunks,
                    QuerySpec* spec) {
  const ServerOptions& o = *d.options;
  if (chunks == ChunkPolicy::kRequired && req.chunks_size() == 0) {
    return Invalid("chunks: at least one chunk is required");
  }
  if (req.chunks_size() > o.max_chunks) {
    return Invalid(absl::StrCat("chunks: ", req.chunks_size(), " chunks, limit is ", o.max_chunks,
                                " (--max-chunks)"));
  }
  for (int i = 0; i < req.chunks_size(); ++i) {
    const v1::QueryChunk& c = req.chunks(i);
    ChunkRef ref;
    if (c.chunk_case() == v1::QueryChunk::kKey) {
      ref.by_key = true;
      ref.key_hex = c.key();
    } else if (c.chunk_case() == v1::QueryChunk::kText) {
      ref.text = c.text();
      ref.parse_special = req.parse_special();
    } else {
      return Invalid(absl::StrCat("chunks[", i, "]: set key or text"));
    }
    spec->chunks.push_back(std::move(ref));
  }
  // Chunk texts are tokenized on the scheduler's prefill thread, before the
  // context limit can be checked in tokens: bound them in bytes here (as the
  // question and each chunk are), so one request cannot hold that thread
  // tokenizing megabytes it will refuse.
  uint64_t text_bytes = 0;
  for (const ChunkRef& ref : spec->chunks) text_bytes += ref.text.size();
  const uint64_t text_limit = static_cast<uint64_t>(o.max_context_tokens) * kMaxBytesPerToken;
  if (text_bytes > text_limit) {
    return Invalid(absl::StrCat("chunks: ", text_bytes, " bytes of chunk text, more than ",
                                o.max_context_tokens, " tokens can hold (--max-context-tokens ",
                                o.max_context_tokens, ", ", kMaxBytesPerToken,
                                " bytes per token)"));
  }
  if (grpc::Status s = ToPrefixMode(*d.model, req.prefix_mode(), &spec->prefix_mode); !s.ok()) {
    return s;
  }
  if (!IsValidUtf8(req.prefix())) return Invalid("prefix: not valid UTF-8");
  spec->prefix = req.prefix();  // limits: QueryRunner::Prepare, before queueing
  switch (req.prefix_store()) {
    case v1::PREFIX_STORE_UNSPECIFIED:
    case v1::PREFIX_STORE_ALWAYS:
      spec->prefix_store = PrefixStorePolicy::kAlways;
      break;
    case v1::PREFIX_STORE_REPEATED:
      spec->prefix_store = PrefixStorePolicy::kRepeated;
      break;
    case v1::PREFIX_STORE_NEVER:
      spec->prefix_store = PrefixStorePolicy::kNever;
      break;
    default:
      return Invalid(
          absl::StrCat("prefix_store: unknown value ", static_cast<int>(req.prefix_store())));
  }
  spec->parse_special = req.parse_special();
  if (req.question().empty()) return Invalid("question: required");
  if (!IsValidUtf8(req.question())) return Invalid("question: not valid UTF-8");
  if (!IsValidUtf8(req.prompt_template())) return Invalid("prompt_template: not valid UTF-8");
  spec->question = req.question();
  spec->prompt_template = req.prompt_template();
  if (!ToMethod(req.method(), &spec->method)) {
    return Invalid(absl::StrCat("method: unknown value ", static_cast<int>(req.method())));
  }
  spec->ratio = req.has_ratio() ? req.ratio().value() : DefaultRatio(spec->method);
  if (!(spec->ratio >= 0.0 && spec->ratio <= 1.0)) {  // also catches NaN
    return Invalid(absl::StrCat("ratio: must be in [0, 1], got ", spec->ratio));
  }
  spec->reorder = req.reorder();
  const int n_layers = d.model->n_layers();
  if (req.scoring_layers_size() > n_layers) {
    return Invalid(absl::StrCat("scoring_layers: ", req.scoring_layers_size(),
                                " entries, the model has ", n_layers, " layers"));
  }
  std::vector<bool> listed(n_layers, false);
  for (int l : req.scoring_layers()) {
    if (l < 0 || l >= n_layers) {
      return Invalid(absl::StrCat("scoring_layers: layer ", l, " outside [0, ", n_layers, ")"));
    }
    if (listed[l]) return Invalid(absl::StrCat("scoring_layers: layer ", l, " listed twice"));
    listed[l] = true;
    spec->scoring_layers.push_back(l);
  }
  if (req.lego_k() < 0) return Invalid("lego_k: must be >= 0");
  spec->lego_k = req.lego_k() == 0 ? 4 : req.lego_k();
  switch (req.deviation()) {
    case v1::DEVIATION_UNSPECIFIED:
    case v1::DEVIATION_V: spec->deviation = Deviation::kV; break;
    case v1::DEVIATION_K: spec->deviation = Deviation::kK; break;
    default:
      return Invalid(absl::StrCat("deviation: unknown value ", static_cast<int>(req.deviation())));
  }
  const v1::Sampling& s = req.sampling();
  if (!(s.temperature() >= 0.0f) || std::isinf(s.temperature())) {
    return Invalid("sampling.temperature: must be a finite number >= 0");
  }
  if (!(s.top_p() >= 0.0f && s.top_p() <= 1.0f)) return Invalid("sampling.top_p: must be in (0, 1]");
  spec->temperature = s.temperature();
  spec->top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  spec->seed = s.seed();
  if (req.max_new_tokens() < 0 || req.max_new_tokens() > o.max_new_tokens) {
    return Invalid(absl::StrCat("max_new_tokens: ", req.max_new_tokens(), " outside [0, ",
                                o.max_new_tokens, "] (--max-new-tokens)"));
  }
  spec->max_new_tokens = req.max_new_tokens() == 0 ? std::min(64, o.max_new_tokens) : req.max_new_tokens();
  if (req.min_new_tokens() < 0 || req.min_new_tokens() > spec->max_new_tokens) {
    return Invalid(absl::StrCat("min_new_tokens: ", req.min_new_tokens(), " outside [0, ",
                                spec->max_new_tokens, "] (max_new_tokens)"));
  }
  // vLLM's ignore_eos: no stop id ends the answer before max_new_tokens.
  spec->min_new_tokens = req.ignore_eos() ? spec->max_new_tokens : req.min_new_tokens();
  if (req.stop_size() > kMaxStopStrings) {
    return Invalid(
        absl::StrCat("stop: ", req.stop_size(), " stop strings, at most ", kMaxStopStrings));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    if (req.stop(i).empty()) return Invalid(absl::StrCat("stop[", i, "]: empty stop string"));
    if (req.stop(i).size() > kMaxStopStringBytes) {
      return Invalid(absl::StrCat("stop[", i, "]: ", req.stop(i).size(), " bytes, at most ",
                                  kMaxStopStringBytes));
    }
    spec->stop.push_back(req.stop(i));
  }
  if (req.stop_ids_size() > kMaxStopIds) {
    return Invalid(absl::StrCat("stop_ids: ", req.stop_ids_size(), " ids, at most ", kMaxStopIds));
  }
  for (int i = 0; i < req.stop_ids_size(); ++i) {
    const int32_t id = req.stop_ids(i);
    if (id < 0 || id >= d.model->config().vocab_size) {
      return Invalid(absl::StrCat("stop_ids[", i, "]: id ", id, " outside the vocabulary [0, ",
                                  d.model->config().vocab_size, ")"));
    }
    spec->stop_ids.push_back(id);
  }
  return grpc::Status::OK;
}

}  // namespace

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "ERROR";
  }
}

absl::Status CheckBearerToken(const std::string* authorization, const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  if (authorization == nullptr) {
    return absl::UnauthenticatedError("authorization: bearer token required");
  }
  const std::string prefix = "Bearer ";
  if (authorization->size() < prefix.size() || authorization->compare(0, prefix.size(), prefix) != 0 ||
      !ConstantTimeEquals(authorization->substr(prefix.size()), token)) {
    return absl::UnauthenticatedError("authorization: invalid bearer token");
  }
  return absl::OkStatus();
}

grpc::Status CheckAuth(const grpc::ServerContext* ctx, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return ToGrpc(CheckBearerToken(nullptr, token));
  const std::string value(it->second.data(), it->second.size());
  return ToGrpc(CheckBearerToken(&value, token));
}

// ------------------------------------------------------------------ ingest

grpc::Status IngestService::DoIngest(grpc::ServerContext* ctx, const v1::IngestRequest& req,
                                     v1::IngestResponse* resp) {
  if (grpc::Status s = CheckServesApi(*d_); !s.ok()) return s;
  if (grpc::Status s = CheckModel(*d_, req.model()); !s.ok()) return s;
  PrefixMode mode;
  if (grpc::Status s = ToPrefixMode(*d_->model, req.prefix_mode(), &mode); !s.ok()) return s;
  if (req.chunks_size() == 0) return Invalid("chunks: at least one chunk is required");
  if (req.chunks_size() > d_->options->max_chunks) {
    return Invalid(absl::StrCat("chunks: ", req.chunks_size(), " chunks, limit is ",
                                d_->options->max_chunks, " (--max-chunks)"));
  }
  // The whole batch is checked (and tokenized, once) before anything is
  // stored: first what needs no tokenizer, then room in the queue, so a full
  // queue refuses a flood of large batches without tokenizing each, then
  // tokens (CheckedTokens does not repeat CheckedText).
  for (int i = 0; i < req.chunks_size(); ++i) {
    if (absl::Status s =
            d_->resolver->CheckedText(req.chunks(i).text(), absl::StrCat("chunks[", i, "].text"));
        !s.ok()) {
      return ToGrpc(s);
    }
    if (req.chunks(i).client_id().size() > kMaxClientIdBytes) {
      return Invalid(absl::StrCat("chunks[", i, "].client_id: ", req.chunks(i).client_id().size(),
                                  " bytes, at most ", kMaxClientIdBytes));
    }
  }
  if (absl::Status room = d_->scheduler->CheckRoom(); !room.ok()) return ToGrpc(room);
  std::vector<std::vector<int32_t>> ids(req.chunks_size());
  for (int i = 0; i < req.chunks_size(); ++i) {
    absl::StatusOr<std::vector<int32_t>> checked =
        d_->resolver->CheckedTokens(req.chunks(i).text(), absl::StrCat("chunks[", i, "].text"),
                                    req.parse_special());
    if (!checked.ok()) return ToGrpc(checked.status());
    ids[i] = *std::move(checked);
  }
  // The prefill runs on the scheduler's prefill thread, in FIFO order with
  // the queries, never alongside the decode loop; one chunk a turn, so a
  // query that arrives meanwhile waits for one chunk's prefill, not the
  // batch's (64 chunks of ~1600 tokens held one for 34 s).
  grpc::Status result = grpc::Status::OK;
  int i = 0;  // the chunk of the next step
  absl::Status queued = d_->scheduler->RunExclusiveInSteps(
      [&](bool* more) -> absl::Status {
        *more = false;
        if (ctx->IsCancelled()) {
          result = grpc::Status(DeadlinePassed(ctx) ? grpc::StatusCode::DEADLINE_EXCEEDED
                                                    : grpc::StatusCode::CANCELLED,
                                "ingest stopped");
          return absl::OkStatus();
        }
        v1::IngestResult* r = resp->add_results();
        r->set_client_id(req.chunks(i).client_id());
        absl::StatusOr<IngestOutcome> out =
            GuardedRun([&] { return d_->resolver->Ingest(ids[i], mode); });
        if (!out.ok()) {
          // The batch was validated up front, so this is the server's failure
          // (disk full, I/O, engine): the whole call fails with a code the
          // client can act on (RESOURCE_EXHAUSTED / UNAVAILABLE: retry; the
          // chunks stored so far come back ALREADY_PRESENT).
          result = ToGrpc(absl::Status(out.status().code(),
                                       absl::StrCat("chunks[", i, "]: ", out.status().message())));
          return absl::OkStatus();
        }
        r->set_chunk_key(out->key_hex);
        r->set_n_tokens(static_cast<int32_t>(out->n_tokens));
        r->set_status(out->already_present ? v1::CHUNK_STATUS_ALREADY_PRESENT
                                           : v1::CHUNK_STATUS_STORED);
        r->set_remote_state(ToRemoteState(out->remote_state));
        if (!out->already_present && d_->metrics) d_->metrics->AddIngestTokens(out->n_tokens);
        *more = ++i < req.chunks_size();
        return absl::OkStatus();
      },
      [ctx] { return ctx->IsCancelled(); });
  if (!queued.ok()) return ToGrpc(queued);
  return result;
}

grpc::Status IngestService::Ingest(grpc::ServerContext* ctx, const v1::IngestRequest* req,
                                   v1::IngestResponse* resp) {
  grpc::Status s = CheckAuth(ctx, d_->auth_token);
  if (s.ok()) s = DoIngest(ctx, *req, resp);
  int stored = 0, present = 0;
  for (const auto& r : resp->results()) {
    stored += r.status() == v1::CHUNK_STATUS_STORED;
    present += r.status() == v1::CHUNK_STATUS_ALREADY_PRESENT;
  }
  LogLine(absl::StrFormat("rpc=Ingest n_chunks=%d stored=%d already_present=%d status=%s%s%s",
                          req->chunks_size(), stored, present, CodeName(s.error_code()),
                          s.ok() ? "" : " error=", s.ok() ? "" : s.error_message()));
  return s;
}

grpc::Status IngestService::IngestStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::IngestResponse, v1::IngestRequest>* stream) {
  grpc::Status s = CheckAuth(ctx, d_->auth_token);
  int batches = 0;
  v1::IngestRequest req;
  // This handler holds a server thread while it waits for the client.
  std::optional<IdleStreamReaper::Watch> watch;
  if (d_->stream_reaper != nullptr) watch.emplace(d_->stream_reaper, ctx);
  while (s.ok() && stream->Read(&req)) {
    if (watch) watch->Working();
    v1::IngestResponse resp;
    s = DoIngest(ctx, req, &resp);
    if (s.ok() && !stream->Write(resp)) s = grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    ++batches;
    if (watch) watch->Waiting();
  }
  const bool reaped = watch && watch->reaped();
  if (reaped) {
    // The client sees CANCELLED (TryCancel); the log says why.
    s = grpc::Status(grpc::StatusCode::CANCELLED,
                     absl::StrCat("nothing sent for ", d_->options->grpc_stream_idle_ms,
                                  " ms (--grpc-stream-idle-ms)"));
  }
  LogLine(absl::StrFormat("rpc=IngestStream batches=%d status=%s%s", batches,
                          CodeName(s.error_code()), reaped ? " reason=idle" : ""));
  return s;
}

// ------------------------------------------------------------------- query

grpc::Status CheckServesApi(const ServiceDeps& d) {
  if (d.group_rank <= 0) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("this process is rank ", d.group_rank, " of a sequence-parallel group (",
                   d.options->world_size, " ranks); send requests to rank 0 (--dist-init ",
                   d.options->dist_init, ")"));
}

grpc::Status PrepareQuery(const ServiceDeps& d, const v1::QueryRequest& req, ChunkPolicy chunks,
                          QuerySpec* spec, bool* token_limit) {
  if (token_limit != nullptr) *token_limit = false;
  grpc::Status s = CheckServesApi(d);
  if (s.ok()) s = CheckModel(d, req.model());
  if (s.ok()) s = ToSpec(d, req, chunks, spec);
  if (!s.ok()) return s;
  const absl::Status prepared = d.runner->Prepare(spec);  // bounded; before queueing
  if (token_limit != nullptr) *token_limit = IsTokenLimitError(prepared);
  return ToGrpc(prepared);
}

grpc::Status ReserveQueryPlace(const ServiceDeps& d, Scheduler::Place* place) {
  absl::StatusOr<Scheduler::Place> taken = d.scheduler->ReservePlace();
  if (!taken.ok()) return ToGrpc(taken.status());
  *place = *std::move(taken);
  return grpc::Status::OK;
}

QueryRun ExecuteQuery(const ServiceDeps& d, const QuerySpec& spec, const QueryStreamIo& io,
                      Scheduler::Place* place) {
  QueryRun run;
  if (d.metrics) d.metrics->AddInflightStreams(1);
  bool write_failed = false;
  const TokenSink sink = [&](int32_t id, std::string_view text) {
    if (io.cancelled()) return false;
    if (!io.write_token(id, text)) {
      write_failed = true;
      return false;
    }
    return true;
  };
  if (d.group != nullptr) {
    // Sequence-parallel: the whole query (prefill over the group, decode on
    // this rank) runs on the scheduler's prefill thread, in FIFO order with
    // the other requests; tokens are written from there.
    absl::StatusOr<QueryOutcome> outcome = absl::UnknownError("not run");
    const absl::Status queued = d.scheduler->RunExclusive(
        [&] {
          outcome = d.group->RunQuery(*d.runner, spec, sink);
          return absl::OkStatus();
        },
        io.cancelled, place);
    run.outcome = queued.ok() ? std::move(outcome) : absl::StatusOr<QueryOutcome>(queued);
  } else {
    // Queued, prefilled and decoded (in the batch) by the scheduler; tokens
    // come back to this thread, which writes them.
    run.outcome = d.scheduler->RunQuery(spec, sink, io.cancelled, place);
  }
  if (d.metrics) d.metrics->AddInflightStreams(-1);
  const absl::StatusOr<QueryOutcome>& out = run.outcome;
  if (!out.ok() && absl::IsCancelled(out.status()) && io.cancelled()) {
    run.status = io.deadline_passed()
                     ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded while queued")
                     : grpc::Status(grpc::StatusCode::CANCELLED, "query cancelled by the client");
  } else if (!out.ok()) {
    run.status = ToGrpc(out.status());
  } else if (out->cancelled || write_failed || io.cancelled()) {
    run.status = io.deadline_passed()
                     ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded during decode")
                     : grpc::Status(grpc::StatusCode::CANCELLED, "query cancelled by the client");
  } else if (d.metrics) {
    d.metrics->ObserveQuery(
        MethodName(spec.method), out->ttft_ms / 1000.0,
        {{"fetch", out->fetch_ms}, {"reposition", out->reposition_ms}, {"score", out->score_ms},
         {"select", out->select_ms}, {"reorder", out->reorder_ms},
         {"recompute", out->recompute_ms}, {"prompt", out->prompt_ms},
         {"first_token", out->first_token_ms}, {"decode", out->decode_ms}},
        out->context_tokens > 0
            ? static_cast<double>(out->recomputed_tokens) / out->context_tokens
            : 0.0,
        out->generated_tokens);
    if (out->prefilled_tokens > 0) d.metrics->AddIngestTokens(out->prefilled_tokens);
    if (!out->prefix_key.empty()) d.metrics->AddPrefix(out->prefix_cached, out->prefix_tokens);
  }
  return run;
}

void FillReport(const QuerySpec& spec, const QueryOutcome& out, v1::Report* r) {
  r->set_ttft_ms(out.ttft_ms);
  v1::StageTimings* t = r->mutable_stages();
  t->set_fetch_ms(out.fetch_ms);
  t->set_reposition_ms(out.reposition_ms);
  t->set_score_ms(out.score_ms);
  t->set_select_ms(out.select_ms);
  t->set_reorder_ms(out.reorder_ms);
  t->set_recompute_ms(out.recompute_ms);
  t->set_prompt_ms(out.prompt_ms);
  t->set_first_token_ms(out.first_token_ms);
  t->set_decode_ms(out.decode_ms);
  r->set_context_tokens(out.context_tokens);
  r->set_recomputed_tokens(out.recomputed_tokens);
  r->set_chunk_hits(out.chunk_hits);
  r->set_chunk_misses(out.chunk_misses);
  r->set_chunk_remote_hits(out.chunk_remote_hits);
  for (int i : out.chunk_order) r->add_chunk_order(i);
  for (const std::string& k : out.chunk_keys) r->add_chunk_keys(k);
  r->set_method(FromMethod(spec.method));
  r->set_ratio(MethodUsesRatio(spec.method) ? spec.ratio : 0.0);
  r->set_stop_reason(out.stop_reason);
  r->set_generated_tokens(static_cast<int32_t>(out.generated_tokens));
  r->set_text(out.text);
  r->set_positions(out.positions);
  r->set_beyond_model_positions(out.beyond_model_positions);
  r->set_prefix_tokens(out.prefix_tokens);
  r->set_prefix_cached(out.prefix_cached);
  r->set_prefix_key(out.prefix_key);
}

void LogQuery(std::string_view origin, int n_chunks, const QuerySpec& spec, const grpc::Status& s,
              const absl::StatusOr<QueryOutcome>& out) {
  const bool ran = out.ok();
  LogLine(absl::StrFormat(
      "%s method=%s ratio=%g n_chunks=%d context_tokens=%d recomputed=%d hits=%d "
      "misses=%d generated=%d ttft_ms=%.2f status=%s",
      origin, s.ok() || ran ? MethodName(spec.method) : "-",
      (s.ok() || ran) && MethodUsesRatio(spec.method) ? spec.ratio : 0.0, n_chunks,
      ran ? out->context_tokens : 0, ran ? out->recomputed_tokens : 0, ran ? out->chunk_hits : 0,
      ran ? out->chunk_misses : 0, ran ? out->generated_tokens : 0, ran ? out->ttft_ms : 0.0,
      CodeName(s.error_code())));
}

grpc::Status QueryService::Query(grpc::ServerContext* ctx, const v1::QueryRequest* req,
                                 grpc::ServerWriter<v1::QueryResponse>* writer) {
  QuerySpec spec;
  QueryRun run;
  grpc::Status s = CheckAuth(ctx, d_->auth_token);
  if (s.ok()) s = PrepareQuery(*d_, *req, ChunkPolicy::kRequired, &spec);
  if (s.ok()) {
    // Write() blocks while the client reads nothing and the stream's window
    // is full (answers past ~64 KiB: a few thousand tokens); the reaper ends
    // a write that waits longer than --grpc-stream-idle-ms.
    std::optional<IdleStreamReaper::Watch> watch;
    if (d_->stream_reaper != nullptr) watch.emplace(d_->stream_reaper, ctx, /*waiting=*/false);
    auto write = [&watch, writer](const v1::QueryResponse& msg) {
      if (watch) watch->Waiting();
      const bool written = writer->Write(msg);
      if (watch) watch->Working();
      return written;
    };
    QueryStreamIo io;
    io.write_token = [&write](int32_t id, std::string_view text) {
      v1::QueryResponse msg;
      msg.mutable_token()->set_id(id);
      msg.mutable_token()->set_text(std::string(text));
      return write(msg);
    };
    io.cancelled = [ctx] { return ctx->IsCancelled(); };
    io.deadline_passed = [ctx] { return DeadlinePassed(ctx); };
    run = ExecuteQuery(*d_, spec, io);
    s = run.status;
    if (s.ok() && req->return_report()) {
      v1::QueryResponse msg;
      FillReport(spec, *run.outcome, msg.mutable_report());
      write(msg);
    }
    if (watch && watch->reaped()) {
      s = grpc::Status(  // as the client sees it (TryCancel)
          grpc::StatusCode::CANCELLED,
          absl::StrCat("the client read nothing for ", d_->options->grpc_stream_idle_ms,
                       " ms (--grpc-stream-idle-ms)"));
    }
  }
  LogQuery("rpc=Query", req->chunks_size(), spec, s, run.outcome);
  return s;
}

// ------------------------------------------------------------------- admin

grpc::Status AdminService::ModelInfo(grpc::ServerContext* ctx, const v1::ModelInfoRequest*,
                                     v1::ModelInfoResponse* resp) {
  if (grpc::Status s = CheckAuth(ctx, d_->auth_token); !s.ok()) return s;
  const Model& m = *d_->model;
  const ModelConfig& c = m.config();
  resp->set_name(d_->model_name);
  resp->set_fingerprint(m.fingerprint());
  resp->set_model_type(c.model_type);
  resp->set_n_layers(static_cast<int32_t>(c.num_hidden_layers));
  resp->set_n_heads(static_cast<int32_t>(c.num_attention_heads));
  resp->set_n_kv_heads(static_cast<int32_t>(c.num_key_value_heads));
  resp->set_head_dim(static_cast<int32_t>(c.head_dim));
  resp->set_vocab_size(c.vocab_size);
  resp->set_device(m.device().str());
  resp->set_dtype(std::string(c10::toString(m.dtype())));
  for (int l : DefaultScoringLayers(m)) resp->add_default_scoring_layers(l);
  resp->set_kv_codec(KvCodecName(d_->kv_codec.kind));
  resp->set_kv_bytes_per_token(KvBytesPerToken(m, d_->kv_codec));
  resp->set_raw_kv_bytes_per_token(KvBytesPerToken(m, KvCodec{}));
  for (int64_t id : StopTokenIds(c)) resp->add_stop_ids(static_cast<int32_t>(id));
  if (c.bos_token_id.has_value()) {
    resp->mutable_bos_token_id()->set_value(static_cast<int32_t>(*c.bos_token_id));
  }
  if (d_->chat_template != nullptr) {
    resp->set_chat_template(d_->chat_template->source);
    resp->set_bos_token(d_->chat_template->bos_token);
    resp->set_eos_token(d_->chat_template->eos_token);
    resp->set_add_bos_token(d_->chat_template->add_bos_token);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                 v1::StatsResponse* resp) {
  if (grpc::Status s = CheckAuth(ctx, d_->auth_token); !s.ok()) return s;
  const store::StoreStats st = d_->store->Stats();
  resp->set_records(st.records);
  resp->set_bytes(st.bytes);
  resp->set_ram_hits(st.ram_hits);
  resp->set_disk_hits(st.disk_hits);
  resp->set_misses(st.misses);
  resp->set_corrupt(st.corrupt);
  resp->set_evictions(st.ram_evictions + st.capacity_evictions + st.ttl_expirations);
  resp->set_bytes_read(st.bytes_read);
  resp->set_bytes_written(st.bytes_written);
  resp->set_ram_bytes(st.ram_bytes);
  resp->set_disk_bytes(st.disk_bytes);
  resp->set_kv_bytes_per_token(KvBytesPerToken(*d_->model, d_->kv_codec));
  resp->set_remote_hits(st.remote_hits);
  resp->set_remote_misses(st.remote_misses);
  resp->set_remote_corrupt(st.remote_corrupt);
  resp->set_remote_errors(st.remote_errors);
  resp->set_remote_bytes_read(st.remote_bytes_read);
  resp->set_remote_bytes_written(st.remote_bytes_written);
  resp->set_remote_pending_writes(st.remote_pending_writes);
  resp->set_remote_pending_bytes(st.remote_pending_bytes);
  resp->set_remote_writes(st.remote_writes);
  resp->set_remote_write_failed(st.remote_write_failed);
  resp->set_remote_write_dropped(st.remote_write_dropped);
  resp->set_remote_fill_dropped(st.remote_fill_dropped);
  return grpc::Status::OK;
}

grpc::Status AdminService::DeleteChunk(grpc::ServerContext* ctx, const v1::DeleteChunkRequest* req,
                                       v1::DeleteChunkResponse* resp) {
  if (grpc::Status s = CheckAuth(ctx, d_->auth_token); !s.ok()) return s;
  absl::StatusOr<store::ChunkKey> key = store::ChunkKey::FromHex(req->chunk_key());
  if (!key.ok()) return Invalid("chunk_key: expected 64 hex digits");
  absl::StatusOr<bool> deleted = d_->store->Delete(*key);
  if (!deleted.ok()) return ToGrpc(deleted.status());
  resp->set_deleted(*deleted);
  LogLine(absl::StrFormat("rpc=DeleteChunk key=%s deleted=%d status=OK", req->chunk_key(), *deleted));
  return grpc::Status::OK;
}

grpc::Status AdminService::Compact(grpc::ServerContext* ctx, const v1::CompactRequest*,
                                   v1::CompactResponse*) {
  if (grpc::Status s = CheckAuth(ctx, d_->auth_token); !s.ok()) return s;
  grpc::Status s = ToGrpc(d_->store->Compact());
  LogLine(absl::StrFormat("rpc=Compact status=%s", CodeName(s.error_code())));
  return s;
}

}  // namespace infoflow::server
