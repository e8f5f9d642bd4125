// The gRPC services of infoflow.v1 (proto/infoflow/v1/infoflow.proto). Each
// handler checks auth, validates and translates the request, calls the
// Scheduler / ChunkResolver / QueryRunner / ChunkStore, translates the result back, and
// logs one key=value line. No computation lives here.
#ifndef INFOFLOW_SERVER_SERVICES_H_
#define INFOFLOW_SERVER_SERVICES_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "engine/text/model_chat_template.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "server/chunk_resolver.h"
#include "server/idle_stream_reaper.h"
#include "server/metrics.h"
#include "server/query_runner.h"
#include "server/scheduler.h"
#include "server/server_options.h"

namespace infoflow::server {

class GroupLeader;

// What the services share; owned by InfoflowServer.
struct ServiceDeps {
  const Model* model = nullptr;
  std::string model_name;
  store::ChunkStore* store = nullptr;
  const ChunkResolver* resolver = nullptr;
  const QueryRunner* runner = nullptr;
  Metrics* metrics = nullptr;  // may be null (no /metrics)
  Scheduler* scheduler = nullptr;  // runs every query and ingest batch
  const ServerOptions* options = nullptr;
  std::string auth_token;  // empty = no auth
  KvCodec kv_codec;        // how new chunk records are stored
  // The model directory's chat template (tokenizer_config.json /
  // chat_template.jinja); null when it has none or it does not parse.
  std::shared_ptr<const ModelChatTemplate> chat_template;
  // Sequence-parallel group (--world-size > 1). Rank 0: every query runs
  // over the group (GroupLeader::RunQuery, on the scheduler's prefill
  // thread, one at a time). group_rank > 0: this process only serves the
  // group; Ingest and Query are refused with FAILED_PRECONDITION. -1: no group.
  GroupLeader* group = nullptr;
  int group_rank = -1;
  // Cancels a stream that waits on its client too long (--grpc-stream-idle-ms):
  // an IngestStream whose client sends nothing, a Query whose client reads nothing.
  IdleStreamReaper* stream_reaper = nullptr;
};

// The code's name as gRPC spells it ("RESOURCE_EXHAUSTED"), for log lines
// and metric labels.
const char* CodeName(grpc::StatusCode code);

// FAILED_PRECONDITION when this process is a rank > 0 of a group (requests
// belong to rank 0), else OK.
grpc::Status CheckServesApi(const ServiceDeps& d);

// OK when no token is configured or the call carries
// "authorization: Bearer <token>" (constant-time compare); else
// UNAUTHENTICATED.
grpc::Status CheckAuth(const grpc::ServerContext* ctx, const std::string& token);

// CheckAuth for any transport: `authorization` is the header's value, or
// null when the request has none. Unauthenticated naming what is wrong.
absl::Status CheckBearerToken(const std::string* authorization, const std::string& token);

// ---- The Query call, transport-neutral (gRPC's Query and the HTTP front
// end, server/http/, both run exactly this: one path into the scheduler).

// Fixed bounds on a QueryRequest's repeated fields (both transports; the
// HTTP front end's arrays are held to them too). The decode loop reads every
// stop string and stop id once per token of its query, and scoring reads every
// listed layer, on the scheduler's threads that all queries share: unbounded,
// one 64 MiB request could stall every stream for seconds per token.
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr int kMaxStopIds = 1024;
// IngestChunk.client_id is echoed in the reply: a caller's label, not data.
inline constexpr size_t kMaxClientIdBytes = 1024;
// scoring_layers: at most one entry per model layer, no layer twice.

// Whether a query may come without chunks. gRPC's Query answers over chunks
// and refuses none (INVALID_ARGUMENT: a caller that forgot them learns it
// instead of getting an answer without its context); the OpenAI API serves
// a prompt without the blend separator as any completion endpoint does, a
// plain prompt: prefix + question prefilled whole.
enum class ChunkPolicy { kRequired, kOptional };

// Checks the model selector, validates and translates `req` into *spec and
// tokenizes it against the limits (QueryRunner::Prepare). No engine work,
// nothing queued: every limit is checked before work starts. Errors name
// the request field (INVALID_ARGUMENT, FAILED_PRECONDITION). When
// `token_limit` is not null it is set to whether the refusal is a length one
// (IsTokenLimitError, server/token_limit.h), which the gRPC status drops.
grpc::Status PrepareQuery(const ServiceDeps& d, const infoflow::v1::QueryRequest& req,
                          ChunkPolicy chunks, QuerySpec* spec, bool* token_limit = nullptr);

// How a transport hands a query's tokens to its client.
struct QueryStreamIo {
  // Delivers one token; false when the client is gone (the query stops).
  std::function<bool(int32_t id, std::string_view text)> write_token;
  // Polled while queued and between decode steps: true stops the query
  // (client gone, deadline passed, server shutting down).
  std::function<bool()> cancelled;
  // After a stop: whether the deadline (rather than the client) caused it.
  std::function<bool()> deadline_passed;
};

struct QueryRun {
  grpc::Status status;  // OK, or why the query failed or stopped
  absl::StatusOr<QueryOutcome> outcome = absl::UnknownError("not run");
};

// Runs a PrepareQuery'd spec on the scheduler, calling io.write_token on
// this thread for each token, and records the query's metrics when it
// completes. `status` is CANCELLED / DEADLINE_EXCEEDED when the client or
// deadline stopped it, the scheduler's and runner's errors otherwise;
// `outcome` holds the report data whenever the query ran.
// With a held `place` (ReserveQueryPlace) it queues in that place, and is
// never refused for a full queue.
QueryRun ExecuteQuery(const ServiceDeps& d, const QuerySpec& spec, const QueryStreamIo& io,
                      Scheduler::Place* place = nullptr);

// Takes a place in the scheduler's queue for a query about to run, for a
// transport that must say "busy" before it commits to its reply (the HTTP
// front end's streams: after the 200, a full queue could only be an error
// event, which OpenAI clients do not retry as they retry a 429).
// RESOURCE_EXHAUSTED (queue full) or UNAVAILABLE (shutting down), as
// ExecuteQuery would have answered.
grpc::Status ReserveQueryPlace(const ServiceDeps& d, Scheduler::Place* place);

// The Report message of a completed query.
void FillReport(const QuerySpec& spec, const QueryOutcome& out, infoflow::v1::Report* report);

// The one key=value log line per query; `origin` opens it ("rpc=Query").
void LogQuery(std::string_view origin, int n_chunks, const QuerySpec& spec,
              const grpc::Status& status, const absl::StatusOr<QueryOutcome>& out);

class IngestService final : public infoflow::v1::ChunkIngest::Service {
 public:
  explicit IngestService(const ServiceDeps* deps) : d_(deps) {}
  grpc::Status Ingest(grpc::ServerContext* ctx, const infoflow::v1::IngestRequest* req,
                      infoflow::v1::IngestResponse* resp) override;
  grpc::Status IngestStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<infoflow::v1::IngestResponse, infoflow::v1::IngestRequest>* stream)
      override;

 private:
  grpc::Status DoIngest(grpc::ServerContext* ctx, const infoflow::v1::IngestRequest& req,
                        infoflow::v1::IngestResponse* resp);
  const ServiceDeps* d_;
};

class QueryService final : public infoflow::v1::Query::Service {
 public:
  explicit QueryService(const ServiceDeps* deps) : d_(deps) {}
  grpc::Status Query(grpc::ServerContext* ctx, const infoflow::v1::QueryRequest* req,
                     grpc::ServerWriter<infoflow::v1::QueryResponse>* writer) override;

 private:
  const ServiceDeps* d_;
};

class AdminService final : public infoflow::v1::Admin::Service {
 public:
  explicit AdminService(const ServiceDeps* deps) : d_(deps) {}
  grpc::Status ModelInfo(grpc::ServerContext* ctx, const infoflow::v1::ModelInfoRequest* req,
                         infoflow::v1::ModelInfoResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const infoflow::v1::StatsRequest* req,
                     infoflow::v1::StatsResponse* resp) override;
  grpc::Status DeleteChunk(grpc::ServerContext* ctx, const infoflow::v1::DeleteChunkRequest* req,
                           infoflow::v1::DeleteChunkResponse* resp) override;
  grpc::Status Compact(grpc::ServerContext* ctx, const infoflow::v1::CompactRequest* req,
                       infoflow::v1::CompactResponse* resp) override;

 private:
  const ServiceDeps* d_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_SERVICES_H_
