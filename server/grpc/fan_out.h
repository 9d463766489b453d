#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/grpc/rpc_metrics.h"

namespace jobbroker::server {

// What FanOut and FindOne share: a call to each other leader (`part(address)` made before the
// calls start, so the map does not change while answers arrive), and, when this node's own
// answer must wait for its read fence (core::ReadFence), that fence's verdict. `parts` counts
// both. Each answer is settled once; the last one finishes the call.
template <typename Response>
class LeaderCalls : public grpc::ServerUnaryReactor {
 public:
  struct Part {
    std::unique_ptr<grpc::ClientContext> ctx;
    Response response;
  };

  Part& part(const std::string& address) { return parts_[address]; }
  void Done(Part& part, const grpc::Status& status) { Settle(status, &part.response); }
  // This node's part may be shown (OK) or not (its fence's refusal).
  void LocalPassed(const grpc::Status& status) { Settle(status, nullptr); }

  void OnCancel() override {
    for (auto& [address, part] : parts_) part.ctx->TryCancel();
  }
  void OnDone() override { delete this; }

 protected:
  // One answer: another leader's (`part_response`) or this node's fence's (null).
  virtual void Settle(const grpc::Status& status, Response* part_response) = 0;

 private:
  std::map<std::string, Part> parts_;
};

// A listing in cluster mode (ListQueues, ListWorkers, ListSchedules): this node's part is in the
// response already; each other leader's is added (`add`) as it comes, and the whole is completed
// (`complete`: sorted, merged) and answered once all have, or answered with the first failure
// (this node's fence's refusal included).
template <typename Response>
class FanOut final : public LeaderCalls<Response> {
 public:
  // `add(part)` runs under the fan-out's lock; `complete()` once, after the last part.
  FanOut(Response* resp, RpcTiming timing, size_t parts, std::function<void(Response&)> add,
         std::function<void()> complete)
      : resp_(resp),
        timing_(timing),
        add_(std::move(add)),
        complete_(std::move(complete)),
        pending_(parts) {}

 private:
  void Settle(const grpc::Status& status, Response* part_response) override {
    grpc::Status failure;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && failure_.ok()) failure_ = status;
      if (status.ok() && part_response != nullptr) add_(*part_response);
      if (--pending_ > 0) return;
      failure = failure_;
    }
    // The last answer: every other thread is done with the response.
    if (failure.ok()) {
      complete_();
    } else {
      resp_->Clear();
    }
    timing_.Record(failure);
    this->Finish(failure);
  }

  Response* const resp_;
  const RpcTiming timing_;
  const std::function<void(Response&)> add_;
  const std::function<void()> complete_;
  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_);
  grpc::Status failure_ ABSL_GUARDED_BY(mu_);
};

// A call by schedule id in cluster mode (GetSchedule, DeleteSchedule, TriggerSchedule) that this
// node could not answer: the schedule lives in one partition, so each other leader is asked (a
// forwarded call, answered from its own partitions only) and the one that has it answers; the
// others say NOT_FOUND. The answer: the one found, else the first other failure (this node's
// fence's refusal included: a NOT_FOUND here must not hide a delete that a failover takes back),
// else `not_found`.
template <typename Response>
class FindOne final : public LeaderCalls<Response> {
 public:
  FindOne(Response* resp, RpcTiming timing, size_t parts, grpc::Status not_found)
      : resp_(resp), timing_(timing), not_found_(std::move(not_found)), pending_(parts) {}

 private:
  void Settle(const grpc::Status& status, Response* part_response) override {
    grpc::Status answer;
    {
      absl::MutexLock lock(&mu_);
      if (status.ok() && part_response != nullptr && !found_) {
        found_ = true;
        resp_->Swap(part_response);
      } else if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND &&
                 failure_.ok()) {
        failure_ = status;
      }
      if (--pending_ > 0) return;
      answer = found_ ? grpc::Status::OK : !failure_.ok() ? failure_ : not_found_;
    }
    timing_.Record(answer);
    this->Finish(answer);
  }

  Response* const resp_;
  const RpcTiming timing_;
  const grpc::Status not_found_;
  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_);
  bool found_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
