#include "server/grpc_request_counter.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "server/metrics.h"
#include "server/services.h"

namespace infoflow::server {
namespace {

namespace gx = grpc::experimental;

constexpr char kApiPrefix[] = "/infoflow.v1.";

class RequestCounter final : public gx::Interceptor {
 public:
  RequestCounter(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->CountGrpcRequest(method_, CodeName(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::string method_;  // "Query", "Ingest", ...
};

class RequestCounterFactory final : public gx::ServerInterceptorFactoryInterface {
 public:
  explicit RequestCounterFactory(Metrics* metrics) : metrics_(metrics) {}

  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo* info) override {
    // "/infoflow.v1.Query/Query" -> "Query".
    const std::string full = info->method() != nullptr ? info->method() : "";
    if (full.rfind(kApiPrefix, 0) != 0) return nullptr;
    return new RequestCounter(metrics_, full.substr(full.rfind('/') + 1));
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

std::unique_ptr<gx::ServerInterceptorFactoryInterface> MakeGrpcRequestCounter(Metrics* metrics) {
  return std::make_unique<RequestCounterFactory>(metrics);
}

}  // namespace infoflow::server
