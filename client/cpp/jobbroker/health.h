#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace jobbroker::client {

// grpc.health.v1.HealthCheckResponse.ServingStatus values.
inline constexpr int kHealthUnknown = 0;
inline constexpr int kHealthServing = 1;
inline constexpr int kHealthNotServing = 2;
inline constexpr int kHealthServiceUnknown = 3;

// "SERVING", "NOT_SERVING", ... for a ServingStatus value.
std::string HealthStatusName(int serving_status);

// Calls the standard grpc.health.v1.Health/Check for `service` ("" = the whole server) on
// `channel`, with `ctx` (which carries the deadline). Blocks until it is answered. On OK,
// `*serving_status` is the answer's ServingStatus (kHealthServing, ...). The status is gRPC's:
// UNAVAILABLE if the server cannot be reached, NOT_FOUND for an unknown `service`.
grpc::Status CheckHealth(grpc::ClientContext* ctx, const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& service, int* serving_status);

}  // namespace jobbroker::client
