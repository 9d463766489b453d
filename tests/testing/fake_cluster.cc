#include "tests/testing/fake_cluster.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/ids.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::testing {

// The node's two services. Each call is recorded, then refused if the node is refusing.
class FakeClusterNode::Services final : public v1::Broker::Service, public v1::Admin::Service {
 public:
  explicit Services(FakeClusterNode* node) : node_(node) {}

  grpc::Status Enqueue(grpc::ServerContext*, const v1::EnqueueRequest* req,
                       v1::EnqueueResponse* resp) override {
    if (grpc::Status s = Take(absl::StrCat("Enqueue ", req->queue())); !s.ok()) return s;
    resp->set_job_id(NewId(req->queue()));
    return grpc::Status::OK;
  }
  grpc::Status EnqueueBatch(grpc::ServerContext*, const v1::EnqueueBatchRequest* req,
                            v1::EnqueueBatchResponse* resp) override {
    std::vector<std::string> queues;
    for (const v1::EnqueueRequest& job : req->jobs()) queues.push_back(job.queue());
    if (grpc::Status s = Take(absl::StrCat("EnqueueBatch ", absl::StrJoin(queues, ","))); !s.ok())
      return s;
    for (const std::string& queue : queues) resp->add_results()->set_job_id(NewId(queue));
    return grpc::Status::OK;
  }
  grpc::Status Work(grpc::ServerContext*,
                    grpc::ServerReaderWriter<v1::WorkResponse, v1::WorkRequest>* stream) override;

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* job) override {
    job->set_id(req->job_id());
    return Take(absl::StrCat("GetJob ", req->job_id()));
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse*) override {
    return Take(absl::StrCat("ListJobs ", req->queue()));
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                         v1::Job* job) override {
    job->set_id(req->job_id());
    return Take(absl::StrCat("CancelJob ", req->job_id()));
  }
  grpc::Status RetryJob(grpc::ServerContext*, const v1::RetryJobRequest* req,
                        v1::RetryJobResponse*) override {
    return Take(absl::StrCat("RetryJob ", req->queue().empty() ? req->job_id() : req->queue()));
  }
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* req,
                         v1::DeleteJobResponse*) override {
    return Take(absl::StrCat("DeleteJob ", req->job_id()));
  }
  grpc::Status ListQueues(grpc::ServerContext*, const v1::ListQueuesRequest*,
                          v1::ListQueuesResponse*) override {
    return Take("ListQueues");
  }
  grpc::Status GetQueue(grpc::ServerContext*, const v1::GetQueueRequest* req,
                        v1::QueueInfo* info) override {
    info->set_name(req->queue());
    return Take(absl::StrCat("GetQueue ", req->queue()));
  }
  grpc::Status UpdateQueuePolicy(grpc::ServerContext*, const v1::UpdateQueuePolicyRequest* req,
                                 v1::QueueInfo* info) override {
    info->set_name(req->queue());
    return Take(absl::StrCat("UpdateQueuePolicy ", req->queue()));
  }
  grpc::Status PauseQueue(grpc::ServerContext*, const v1::PauseQueueRequest* req,
                          v1::QueueInfo* info) override {
    info->set_name(req->queue());
    return Take(absl::StrCat("PauseQueue ", req->queue()));
  }
  grpc::Status ResumeQueue(grpc::ServerContext*, const v1::ResumeQueueRequest* req,
                           v1::QueueInfo* info) override {
    info->set_name(req->queue());
    return Take(absl::StrCat("ResumeQueue ", req->queue()));
  }
  grpc::Status PurgeQueue(grpc::ServerContext*, const v1::PurgeQueueRequest* req,
                          v1::PurgeQueueResponse*) override {
    return Take(absl::StrCat("PurgeQueue ", req->queue()));
  }
  grpc::Status GetCluster(grpc::ServerContext*, const v1::GetClusterRequest*,
                          v1::ClusterInfo* info) override {
    node_->Record("GetCluster");
    int index = 0;
    {
      absl::MutexLock lock(&node_->mu_);
      if (node_->get_cluster_unimplemented_)
        return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method GetCluster");
    }
    for (int n = 0; n < node_->cluster_->size(); ++n) {
      if (&node_->cluster_->node(n) == node_) index = n;
    }
    *info = node_->cluster_->Info(index);
    return grpc::Status::OK;
  }

 private:
  // Records `call`; UNAVAILABLE if the node is refusing.
  grpc::Status Take(std::string call) {
    node_->Record(std::move(call));
    absl::MutexLock lock(&node_->mu_);
    if (!node_->refusing_) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(node_->id_, " does not lead this partition"));
  }

  std::string NewId(const std::string& queue) {
    absl::MutexLock lock(&gen_mu_);
    const uint32_t partitions = node_->cluster_->partitions();
    return core::NewJobId(absl::Now(), core::PartitionOfQueue(queue, partitions), gen_);
  }

  FakeClusterNode* const node_;
  absl::Mutex gen_mu_;
  absl::BitGen gen_ ABSL_GUARDED_BY(gen_mu_);
};

grpc::Status FakeClusterNode::Services::Work(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::WorkResponse, v1::WorkRequest>* stream) {
  v1::WorkRequest req;
  while (stream->Read(&req)) {
    v1::WorkResponse answer;
    answer.mutable_result()->set_request_id(req.request_id());
    std::vector<v1::WorkResponse> pushes;
    switch (req.request_case()) {
      case v1::WorkRequest::kSubscribe: {
        const std::vector<std::string> queues(req.subscribe().queues().begin(),
                                              req.subscribe().queues().end());
        if (grpc::Status s = Take(absl::StrCat("Work ", absl::StrJoin(queues, ","))); !s.ok())
          return s;
        absl::MutexLock lock(&node_->mu_);
        auto& to_push = node_->to_push_;
        for (auto it = to_push.begin(); it != to_push.end();) {
          if (std::find(queues.begin(), queues.end(), it->first) == queues.end()) {
            ++it;
            continue;
          }
          v1::LeasedJob* job = pushes.emplace_back().mutable_job();
          job->set_job_id(it->second);
          job->set_queue(it->first);
          job->set_lease_id(absl::StrCat("1-", it->second));
          job->set_attempt(1);
          job->set_max_attempts(3);
          job->mutable_lease_deadline()->set_seconds(absl::ToUnixSeconds(absl::Now()) + 60);
          it = to_push.erase(it);
        }
        break;
      }
      case v1::WorkRequest::kAck:
        node_->Record(absl::StrCat("Ack ", req.ack().job_id()));
        break;
      case v1::WorkRequest::kAckBatch:
        for (const v1::AckRequest& ack : req.ack_batch().acks())
          node_->Record(absl::StrCat("Ack ", ack.job_id()));
        break;
      case v1::WorkRequest::kFail:
        node_->Record(absl::StrCat("Fail ", req.fail().job_id()));
        break;
      case v1::WorkRequest::kRelease:
        node_->Record(absl::StrCat("Release ", req.release().job_id()));
        break;
      case v1::WorkRequest::kHeartbeat:
        node_->Record(absl::StrCat("Heartbeat ", req.heartbeat().job_id()));
        break;
      default:
        continue;  // flow control: no answer
    }
    if (!stream->Write(answer)) break;
    for (const v1::WorkResponse& push : pushes) stream->Write(push);
  }
  return grpc::Status::OK;
}

FakeClusterNode::FakeClusterNode(FakeCluster* cluster, std::string id)
    : cluster_(cluster), id_(std::move(id)), services_(std::make_unique<Services>(this)) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(static_cast<v1::Broker::Service*>(services_.get()));
  builder.RegisterService(static_cast<v1::Admin::Service*>(services_.get()));
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
}

FakeClusterNode::~FakeClusterNode() { Stop(); }

std::vector<std::string> FakeClusterNode::Calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int FakeClusterNode::Count(const std::string& method) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(calls_.begin(), calls_.end(), [&](const std::string& c) {
    return c == method || absl::StartsWith(c, absl::StrCat(method, " "));
  }));
}

void FakeClusterNode::ClearCalls() {
  absl::MutexLock lock(&mu_);
  calls_.clear();
}

void FakeClusterNode::SetRefusing(bool refusing) {
  absl::MutexLock lock(&mu_);
  refusing_ = refusing;
}

void FakeClusterNode::SetGetClusterUnimplemented(bool unimplemented) {
  absl::MutexLock lock(&mu_);
  get_cluster_unimplemented_ = unimplemented;
}

void FakeClusterNode::PushJob(const std::string& queue, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  to_push_.emplace_back(queue, job_id);
}

void FakeClusterNode::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  server_->Wait();
}

void FakeClusterNode::Record(std::string call) {
  absl::MutexLock lock(&mu_);
  calls_.push_back(std::move(call));
}

FakeCluster::FakeCluster(int nodes, uint32_t partitions, std::string cluster_name)
    : partitions_(partitions), cluster_name_(std::move(cluster_name)) {
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t p = 0; p < partitions; ++p) leaders_.push_back(static_cast<int>(p) % nodes);
    alive_.assign(nodes, true);
  }
  for (int n = 0; n < nodes; ++n) {
    nodes_.push_back(
        std::unique_ptr<FakeClusterNode>(new FakeClusterNode(this, absl::StrCat("node-", n))));
  }
}

FakeCluster::~FakeCluster() {
  for (auto& node : nodes_) node->Stop();
}

std::vector<std::string> FakeCluster::addresses() const {
  std::vector<std::string> out;
  for (const auto& node : nodes_) out.push_back(node->address());
  return out;
}

void FakeCluster::SetLeader(uint32_t partition, int n) {
  absl::MutexLock lock(&mu_);
  leaders_.at(partition) = n;
}

void FakeCluster::SetAlive(int n, bool alive) {
  absl::MutexLock lock(&mu_);
  alive_.at(n) = alive;
}

int FakeCluster::LeaderOf(uint32_t partition) const {
  absl::MutexLock lock(&mu_);
  return leaders_.at(partition);
}

v1::ClusterInfo FakeCluster::Info(int answering) const {
  absl::MutexLock lock(&mu_);
  v1::ClusterInfo info;
  info.set_cluster_name(cluster_name_);
  info.set_partition_count(partitions_);
  info.set_node_id(nodes_[answering]->id());
  if (cluster_name_.empty()) {
    // A single broker: itself, at the address it listens on, leading every partition.
    info.set_replication_factor(1);
    info.set_min_in_sync(1);
    v1::NodeInfo* self = info.add_nodes();
    self->set_node_id(nodes_[answering]->id());
    self->set_address("0.0.0.0:1");
    self->set_alive(true);
    for (uint32_t p = 0; p < partitions_; ++p) {
      v1::PartitionInfo* partition = info.add_partitions();
      partition->set_partition(p);
      partition->set_leader_node_id(self->node_id());
      partition->set_leader_address(self->address());
    }
    return info;
  }
  info.set_replication_factor(static_cast<uint32_t>(nodes_.size()));
  info.set_min_in_sync(2);
  for (size_t n = 0; n < nodes_.size(); ++n) {
    v1::NodeInfo* node = info.add_nodes();
    node->set_node_id(nodes_[n]->id());
    node->set_address(nodes_[n]->address());
    node->set_alive(alive_[n]);
  }
  for (uint32_t p = 0; p < partitions_; ++p) {
    v1::PartitionInfo* partition = info.add_partitions();
    partition->set_partition(p);
    for (const auto& node : nodes_) partition->add_replicas(node->id());
    if (leaders_[p] < 0) continue;
    partition->set_leader_node_id(nodes_[leaders_[p]]->id());
    partition->set_leader_address(nodes_[leaders_[p]]->address());
    partition->set_epoch(100 + p);
    partition->add_in_sync(nodes_[leaders_[p]]->id());
  }
  return info;
}

}  // namespace jobbroker::testing
