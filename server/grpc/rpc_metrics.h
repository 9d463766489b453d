#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace jobbroker::server {

// Times unary RPCs from the handler's start to their status, by method and status code
// (jobbroker_rpc_duration_seconds). A stream's lifetime is not a latency: streams are not timed,
// except those a service names as timed per message (EnqueueStream, each of whose messages stands
// for an EnqueueBatch call): each message is then timed as a call of that method.
//
// The services time their own calls instead of registering a gRPC interceptor: with any
// interceptor registered, gRPC 1.51 runs every batch of every call through its interceptor
// machinery, which cost 5-7 µs of CPU per unary Enqueue here, a sixth of the broker's whole cost
// per call (docs/performance.md). A timer is an atomic load and one histogram update.

// One method's histograms, one per status code, made on first use so /metrics lists only codes
// that happened. Thread-safe.
class RpcMethodTimer {
 public:
  // `family` is borrowed and must outlive the timer; `method` is its label, "/pkg.Service/Name".
  RpcMethodTimer(prometheus::Family<prometheus::Histogram>& family, std::string method);
  void Observe(grpc::StatusCode code, absl::Duration took);

 private:
  static constexpr int kCodes = 17;  // OK .. UNAUTHENTICATED, the canonical codes
  prometheus::Family<prometheus::Histogram>& family_;
  const std::string method_;
  std::array<std::atomic<prometheus::Histogram*>, kCodes> by_code_{};
};

// The start of one unary call, and the timer it is recorded in (none: metrics are off).
// Copyable and small, so a broker callback can carry it.
class RpcTiming {
 public:
  RpcTiming(RpcMethodTimer* timer, absl::Time start) : timer_(timer), start_(start) {}
  // Records the call as ended now with `status`.
  void Record(const grpc::Status& status) const;

 private:
  RpcMethodTimer* timer_;
  absl::Time start_;
};

// One unary call answered by gRPC's default reactor: Finish records the call, then finishes it.
// Copyable; exactly one copy must call Finish, once.
class UnaryCall {
 public:
  UnaryCall(grpc::CallbackServerContext* ctx, RpcTiming timing)
      : reactor_(ctx->DefaultReactor()), timing_(timing) {}
  // Returns the reactor, for the handler to return.
  grpc::ServerUnaryReactor* Finish(const grpc::Status& status) const;
  grpc::ServerUnaryReactor* Finish(const absl::Status& status) const;
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }

 private:
  grpc::ServerUnaryReactor* reactor_;
  RpcTiming timing_;
};

// The timers of one gRPC service's unary methods. Thread-safe once built.
class RpcServiceTimers {
 public:
  // `family` null: metrics off, Start times nothing. Otherwise borrowed, like RpcMethodTimer's.
  // `per_message`: the streaming methods whose messages are timed as calls.
  RpcServiceTimers(prometheus::Family<prometheus::Histogram>* family,
                   const google::protobuf::ServiceDescriptor& service,
                   const std::vector<std::string>& per_message = {});
  RpcServiceTimers(RpcServiceTimers&&) = default;

  // The timing of a call of `method` (its short name, e.g. "Enqueue") starting now. A name the
  // service does not have is a bug in the caller: it aborts, so the first test calling it fails.
  RpcTiming Start(absl::string_view method) const;

 private:
  std::string service_;
  bool on_;
  // Every method of the service; the timer is null while metrics are off.
  absl::flat_hash_map<std::string, std::unique_ptr<RpcMethodTimer>> methods_;
};

// The jobbroker_rpc_duration_seconds family, and timers for the services that feed it.
class RpcMetrics {
 public:
  // `registry` null: metrics off. Otherwise borrowed and must outlive this and every timer.
  explicit RpcMetrics(prometheus::Registry* registry);
  // The timers of service `name` of `file` (the .proto that declares it; reached through one of
  // its messages, e.g. v1::EnqueueRequest::descriptor()->file(), so that it is surely linked in).
  // Aborts if the file has no such service: a wiring bug. `per_message`: its streaming methods
  // whose messages are each timed as a call.
  RpcServiceTimers For(const google::protobuf::FileDescriptor& file, absl::string_view name,
                       const std::vector<std::string>& per_message = {}) const;

 private:
  prometheus::Family<prometheus::Histogram>* durations_;
};

}  // namespace jobbroker::server
