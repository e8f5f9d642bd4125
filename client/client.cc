#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cache_store/chunk_key.h"

namespace infoflow::client {
namespace v1 = ::infoflow::v1;
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read token file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

Client::Client(const ClientOptions& options) : options_(options) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(options.address, creds, args);
  ingest_ = v1::ChunkIngest::NewStub(channel_);
  query_ = v1::Query::NewStub(channel_);
  admin_ = v1::Admin::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  if (options_.timeout_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(options_.timeout_ms));
  }
}

absl::StatusOr<v1::IngestResponse> Client::Ingest(const v1::IngestRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::IngestResponse resp;
  grpc::Status s = ingest_->Ingest(&ctx, request, &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

absl::Status Client::IngestStream(
    absl::Span<const v1::IngestRequest> batches,
    const std::function<void(const v1::IngestResponse&)>& on_response) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  auto stream = ingest_->IngestStream(&ctx);
  // One batch in flight at a time: the server answers each in order, and
  // this keeps progress reporting honest.
  for (const v1::IngestRequest& b : batches) {
    if (!stream->Write(b)) break;
    v1::IngestResponse resp;
    if (!stream->Read(&resp)) break;
    on_response(resp);
  }
  stream->WritesDone();
  return FromGrpc(stream->Finish());
}

std::string ChunkSetHash(const v1::QueryRequest& request) {
  std::string material;
  for (const v1::QueryChunk& c : request.chunks()) {
    // Length-prefixed so that no two chunk lists share an encoding.
    const std::string& part = c.has_key() ? c.key() : c.text();
    absl::StrAppend(&material, c.has_key() ? "k" : "t", part.size(), ":", part);
  }
  return store::Sha256Hex(material).substr(0, 16);
}

absl::StatusOr<v1::Report> Client::Query(const v1::QueryRequest& request,
                                         const std::function<void(const v1::TokenEvent&)>& on_token) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  // Routing key for consistent-hash load balancing (deploy/README.md): the
  // same chunk set always reaches the pod whose RAM tier holds it.
  ctx.AddMetadata("x-infoflow-chunkset", ChunkSetHash(request));
  auto reader = query_->Query(&ctx, request);
  v1::QueryResponse msg;
  v1::Report report;
  while (reader->Read(&msg)) {
    if (msg.has_token()) on_token(msg.token());
    else if (msg.has_report()) report = msg.report();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpc(s);
  return report;
}

absl::StatusOr<v1::StatsResponse> Client::Stats() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StatsResponse resp;
  grpc::Status s = admin_->Stats(&ctx, v1::StatsRequest(), &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

absl::StatusOr<v1::ModelInfoResponse> Client::ModelInfo() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::ModelInfoResponse resp;
  grpc::Status s = admin_->ModelInfo(&ctx, v1::ModelInfoRequest(), &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

}  // namespace infoflow::client
