// quickstart: enqueue a job, work it as a worker would, and read its final state.
// Usage: quickstart [ADDRESS]   (default 127.0.0.1:7070)
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace v1 = jobbroker::v1;

int main(int argc, char** argv) {
  auto channel = grpc::CreateChannel(argc > 1 ? argv[1] : "127.0.0.1:7070",
                                     grpc::InsecureChannelCredentials());
  auto broker = v1::Broker::NewStub(channel);
  auto admin = v1::Admin::NewStub(channel);

  // Producer: the reply comes once the job is in the synced write-ahead log.
  v1::EnqueueRequest enqueue;
  enqueue.set_queue("emails");
  enqueue.set_payload(R"({"to":"ada@example.com"})");
  enqueue.set_dedup_key("welcome-ada");  // enqueueing twice creates one job
  v1::EnqueueResponse enqueued;
  grpc::ClientContext c1;
  if (auto s = broker->Enqueue(&c1, enqueue, &enqueued); !s.ok()) {
    std::cerr << "enqueue: " << s.error_message() << "\n";
    return 1;
  }

  // Worker: lease (waiting up to 5 s for a job), do the work, ack with the lease id.
  v1::LeaseRequest lease;
  lease.set_queue("emails");
  lease.set_worker_id("quickstart");
  lease.mutable_wait()->set_seconds(5);
  v1::LeaseResponse leased;
  grpc::ClientContext c2;
  if (auto s = broker->Lease(&c2, lease, &leased); !s.ok() || leased.jobs().empty()) {
    std::cerr << "lease: " << (s.ok() ? "no job" : s.error_message()) << "\n";
    return 1;
  }
  const v1::LeasedJob& job = leased.jobs(0);
  std::cout << "working on " << job.job_id() << " attempt " << job.attempt() << " idempotency_key "
            << job.idempotency_key() << ": " << job.payload() << "\n";
  v1::AckRequest ack;
  ack.set_job_id(job.job_id());
  ack.set_lease_id(job.lease_id());
  ack.set_result("sent");
  v1::AckResponse acked;
  grpc::ClientContext c3;
  if (auto s = broker->Ack(&c3, ack, &acked); !s.ok()) {
    std::cerr << "ack: " << s.error_message() << "\n";
    return 1;
  }

  v1::GetJobRequest get;
  get.set_job_id(enqueued.job_id());
  v1::Job final_state;
  grpc::ClientContext c4;
  if (auto s = admin->GetJob(&c4, get, &final_state); !s.ok()) {
    std::cerr << "get: " << s.error_message() << "\n";
    return 1;
  }
  std::cout << final_state.id() << " is " << v1::JobState_Name(final_state.state()) << "\n";
  return final_state.state() == v1::JOB_STATE_COMPLETED ? 0 : 1;
}
