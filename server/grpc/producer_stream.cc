#include "server/grpc/producer_stream.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/convert/convert.h"
#include "server/grpc/enqueue_batch.h"
#include "server/grpc/grpc_status.h"

namespace jobbroker::server {
namespace {

v1::EnqueueStreamResponse Refusal(uint64_t request_id, const absl::Status& status) {
  v1::EnqueueStreamResponse response;
  response.set_request_id(request_id);
  response.set_code(static_cast<int32_t>(status.code()));
  response.set_message(std::string(status.message()));
  return response;
}

}  // namespace

ProducerStream* ProducerStream::Start(node::Partitions& broker, const RpcAuth& auth,
                                      const TokenEntry* caller, Router& router,
                                      Forwarder* forwarder, const RpcServiceTimers& timers,
                                      std::atomic<int>& open, grpc::CallbackServerContext* ctx) {
  std::shared_ptr<ProducerStream> stream(
      new ProducerStream(broker, auth, caller, router, forwarder, timers, open, ctx));
  stream->self_ = stream;
  open.fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&stream->mu_);
    stream->reading_ = true;
  }
  stream->StartRead(&stream->request_);
  return stream.get();
}

void ProducerStream::OnReadDone(bool ok) {
  // Taken out while reading_ still holds off other threads: once it is cleared, an answer's Pump
  // may start the next read into request_ at once.
  v1::EnqueueStreamRequest read;
  if (ok) read = std::move(request_);
  {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) {
      read_closed_ = true;
    } else {
      ++pending_;
    }
  }
  if (ok) Handle(std::move(read), timers_.Start("EnqueueStream"));
  Pump();
}

void ProducerStream::Handle(v1::EnqueueStreamRequest request, RpcTiming timing) {
  const uint64_t id = request.request_id();
  absl::StatusOr<std::vector<core::EnqueueSpec>> specs =
      BatchSpecs(auth_, caller_, request.batch());
  if (!specs.ok()) return Answer(Refusal(id, specs.status()), timing);
  // As EnqueueBatch: a batch of one partition another node leads is answered there.
  if (std::optional<uint32_t> partition = OnePartition(router_, *specs)) {
    auto batch = std::make_shared<v1::EnqueueBatchRequest>(std::move(*request.mutable_batch()));
    if (Forwarded(*partition, id, std::move(batch), timing)) return;
  }
  broker_.EnqueueBatch(
      std::move(*specs),
      [this, alive = self_, id, timing](absl::StatusOr<std::vector<core::EnqueueResult>> r) {
        if (!r.ok()) return Answer(Refusal(id, r.status()), timing);
        v1::EnqueueStreamResponse response;
        response.set_request_id(id);
        for (const core::EnqueueResult& e : *r) ToProto(e, response.add_results());
        Answer(std::move(response), timing);
      },
      /*batch=*/true);
}

bool ProducerStream::Forwarded(uint32_t partition, uint64_t request_id,
                               std::shared_ptr<v1::EnqueueBatchRequest> batch, RpcTiming timing) {
  const Route route = router_.RouteOf(partition, *ctx_);
  if (route.kind == Route::Kind::kLocal) return false;
  if (route.kind != Route::Kind::kForward) {
    Answer(Refusal(request_id, route.why), timing);
    return true;
  }
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    std::shared_ptr<v1::EnqueueBatchRequest> request;
    v1::EnqueueBatchResponse response;
  };
  auto call = std::make_shared<Call>();
  call->context = forwarder_->ContextFor(*ctx_);
  const absl::Time batch_deadline = absl::Now() + kForwardDeadline;
  if (absl::FromChrono(call->context->deadline()) > batch_deadline)
    call->context->set_deadline(absl::ToChronoTime(batch_deadline));
  call->request = std::move(batch);
  forwarder_->BrokerAt(route.address)
      .async()
      ->EnqueueBatch(
          call->context.get(), call->request.get(), &call->response,
          [this, alive = self_, call, request_id, timing](const grpc::Status& status) {
            if (!status.ok()) {
              return Answer(Refusal(request_id,
                                    absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                 status.error_message())),
                            timing);
            }
            v1::EnqueueStreamResponse response;
            response.set_request_id(request_id);
            response.mutable_results()->Swap(call->response.mutable_results());
            Answer(std::move(response), timing);
          });
  return true;
}

void ProducerStream::Answer(v1::EnqueueStreamResponse response, RpcTiming timing) {
  timing.Record(grpc::Status(static_cast<grpc::StatusCode>(response.code()), ""));
  {
    absl::MutexLock lock(&mu_);
    --pending_;
    if (!cancelled_ && !finished_) outbox_.Push(std::move(response));
  }
  Pump();
}

void ProducerStream::Pump() {
  const v1::EnqueueStreamResponse* to_write = nullptr;
  bool read = false;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!cancelled_) to_write = outbox_.NextToWrite();
    if (!reading_ && !read_closed_ && !cancelled_ && pending_ < kMaxPending &&
        outbox_.size() < static_cast<size_t>(kMaxPending)) {
      reading_ = true;
      read = true;
    }
    const bool done_talking = read_closed_ || cancelled_;
    if (done_talking && !reading_ && pending_ == 0 && !outbox_.writing() &&
        (cancelled_ || outbox_.drained())) {
      finished_ = true;
      finish = cancelled_ ? grpc::Status::CANCELLED : grpc::Status::OK;
    }
  }
  if (to_write != nullptr) StartWrite(to_write);
  if (read) StartRead(&request_);
  if (finish.has_value()) Finish(*finish);
}

void ProducerStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (!outbox_.WriteDone(ok)) {
      cancelled_ = true;     // the client is gone
      outbox_.TakeUnsent();  // answers nobody will read: nothing to give back
    }
  }
  Pump();
}

void ProducerStream::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  Pump();
}

void ProducerStream::OnDone() {
  open_.fetch_sub(1, std::memory_order_relaxed);
  self_.reset();  // may delete this
}

}  // namespace jobbroker::server
