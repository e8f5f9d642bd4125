// Counts every finished call of the infoflow.v1 services by method and status
// code (Metrics::CountGrpcRequest, infoflow_grpc_requests_total), in one
// place: a server interceptor sees each call's final status, whichever of a
// handler's returns gave it. Calls of other services (health, reflection)
// are not counted.
#ifndef INFOFLOW_SERVER_GRPC_REQUEST_COUNTER_H_
#define INFOFLOW_SERVER_GRPC_REQUEST_COUNTER_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

namespace infoflow::server {

class Metrics;

// For ServerBuilder::experimental().SetInterceptorCreators. `metrics` must
// outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeGrpcRequestCounter(
    Metrics* metrics);

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_GRPC_REQUEST_COUNTER_H_
