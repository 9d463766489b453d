#include "cluster/transport/peer_transport.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/transport/wire.h"

namespace jobbroker::cluster {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

// One peer: its address, the frames queued for it, and a thread that keeps one stream to it
// open. The stream is gRPC's callback client API (OutboundStream): frames are written one at a
// time as they are queued, and the end of the stream is seen even while nothing is being
// written (a peer that refuses the caller, or goes away, ends it at once), so the next frame
// goes on a new stream rather than being lost on a dead one.
class PeerTransport::Link {
 public:
  Link(PeerTransport* transport, std::string address)
      : transport_(transport), address_(std::move(address)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~Link() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  void SetAddress(const std::string& address) {
    absl::MutexLock lock(&mu_);
    if (address == address_) return;
    address_ = address;
    ++address_version_;
  }

  bool Enqueue(v1::ReplicationFrame frame) {
    {
      absl::MutexLock lock(&mu_);
      if (queue_.size() >= transport_->options_.max_queued_per_peer) return false;
      queue_.push_back(std::move(frame));
    }
    WriteNext();
    return true;
  }

  absl::Status last_status() const {
    absl::MutexLock lock(&mu_);
    return last_status_;
  }

 private:
  class OutboundStream final : public grpc::ClientWriteReactor<v1::ReplicationFrame> {
   public:
    explicit OutboundStream(Link* link) : link_(link) {}
    void OnWriteDone(bool ok) override { link_->WriteDone(ok); }
    // The server sends its metadata only when it ends the stream; !ok: it ended it with an
    // error (a refusal) or the connection broke. Either way no more frames go on this stream.
    void OnReadInitialMetadataDone(bool ok) override {
      if (!ok) link_->Close();
    }
    void OnDone(const grpc::Status& status) override { link_->Done(status); }

    grpc::ClientContext context;
    v1::StreamSummary summary;
    v1::ReplicationFrame frame;  // the one being written

   private:
    Link* const link_;
  };

  void Run() {
    const PeerTransportOptions& options = transport_->options_;
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(options.max_frame_bytes);
    args.SetMaxReceiveMessageSize(options.max_frame_bytes);
    // gRPC backs a failing channel's reconnects off up to 120 s: a peer that restarts after a
    // few seconds down would not hear from this node for tens of seconds, and its partitions
    // could not rejoin their in-sync sets meanwhile. Peers come back at the speed of a restart.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    if (options.keepalive_time > absl::ZeroDuration()) {
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                  static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                  static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
      // The stream may carry nothing for long (no writes to replicate): ping all the same.
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Replication::Stub> stub;
    uint64_t channel_version = ~uint64_t{0};
    for (;;) {
      std::string address;
      uint64_t version = 0;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        address = address_;
        version = address_version_;
      }
      if (stub == nullptr || channel_version != version) {
        channel = grpc::CreateCustomChannel(address, credentials, args);
        stub = v1::Replication::NewStub(channel);
        channel_version = version;
      }
      auto stream = std::make_unique<OutboundStream>(this);
      if (!options.peer_token.empty()) {
        stream->context.AddMetadata("authorization", absl::StrCat("Bearer ", options.peer_token));
      }
      stub->async()->Stream(&stream->context, &stream->summary, stream.get());
      {
        absl::MutexLock lock(&mu_);
        stream_ = stream.get();
        writing_ = closing_ = done_ = hold_released_ = false;
      }
      // The hold keeps the stream open while no write is outstanding, so that Enqueue may start
      // one; it is released once no more will be (Close).
      stream->AddHold();
      stream->StartCall();  // also waits for the server's initial metadata (OnReadInitial...)
      WriteNext();

      {
        absl::MutexLock lock(&mu_);
        auto ending = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return done_ || stopping_ || address_version_ != version;
        };
        mu_.Await(absl::Condition(&ending));
      }
      Close();
      stream->context.TryCancel();  // a no-op for a stream that already ended
      absl::MutexLock lock(&mu_);
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
      mu_.Await(absl::Condition(&done));
      stream_ = nullptr;
      last_status_ = status_;
      if (stopping_) return;
      if (address_version_ == version) {
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        mu_.AwaitWithTimeout(absl::Condition(&stopping), options.reconnect_delay);
      }
      // `stream` is destroyed here, after its OnDone.
    }
  }

  // Starts writing the next queued frame if the stream is open and idle. gRPC calls are made
  // outside mu_: a reaction may run on the calling thread.
  void WriteNext() {
    OutboundStream* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (stream_ == nullptr || writing_ || closing_ || queue_.empty()) return;
      stream = stream_;
      stream->frame = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    stream->StartWrite(&stream->frame);
  }

  void WriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        transport_->sent_.fetch_add(1, std::memory_order_relaxed);
      } else {
        // The stream broke under this frame: it is lost with it (the replica resends).
        transport_->dropped_.fetch_add(1, std::memory_order_relaxed);
        closing_ = true;
      }
    }
    if (ok) WriteNext();
    ReleaseHoldIfClosed();
  }

  // No more frames go on the current stream.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    ReleaseHoldIfClosed();
  }

  void ReleaseHoldIfClosed() {
    OutboundStream* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (stream_ == nullptr || !closing_ || writing_ || hold_released_) return;
      hold_released_ = true;
      stream = stream_;
    }
    stream->RemoveHold();
  }

  void Done(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = FromGrpc(status);
  }

  PeerTransport* const transport_;
  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  uint64_t address_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::ReplicationFrame> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stream in progress (owned by Run) and where it is.
  OutboundStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;        // a StartWrite is outstanding
  bool closing_ ABSL_GUARDED_BY(mu_) = false;        // no StartWrite will follow
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;  // RemoveHold was called
  bool done_ ABSL_GUARDED_BY(mu_) = false;           // OnDone ran
  absl::Status status_ ABSL_GUARDED_BY(mu_);         // how it ended
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);    // how the last one ended
  std::thread thread_;                               // last: started once the members above exist
};

// One peer's stream into this node: each frame that decodes and names this node is delivered;
// the first that does not ends the stream with INVALID_ARGUMENT naming the field.
class PeerTransport::InboundStream final : public grpc::ServerReadReactor<v1::ReplicationFrame> {
 public:
  InboundStream(PeerTransport* transport, v1::StreamSummary* summary, const absl::Status& refused)
      : transport_(transport), summary_(summary) {
    if (!refused.ok()) {
      Finish(ToGrpc(refused));
      return;
    }
    StartRead(&frame_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender is done, or the call ended
      Finish(grpc::Status::OK);
      return;
    }
    absl::StatusOr<ReplicationMessage> message = FromWire(frame_);
    if (message.ok() && message->to != transport_->options_.node_id) {
      message = absl::InvalidArgumentError(absl::StrCat("replication frame: to: \"", message->to,
                                                        "\" is not this node (\"",
                                                        transport_->options_.node_id, "\")"));
    }
    if (!message.ok()) {
      transport_->refused_frames_.fetch_add(1, std::memory_order_relaxed);
      Finish(ToGrpc(message.status()));
      return;
    }
    summary_->set_frames(summary_->frames() + 1);
    transport_->received_.fetch_add(1, std::memory_order_relaxed);
    transport_->deliver_(*std::move(message));
    StartRead(&frame_);
  }

  void OnDone() override { delete this; }

 private:
  PeerTransport* const transport_;
  v1::StreamSummary* const summary_;
  v1::ReplicationFrame frame_;
};

grpc::ServerReadReactor<v1::ReplicationFrame>* PeerTransport::Receiver::Stream(
    grpc::CallbackServerContext* context, v1::StreamSummary* summary) {
  absl::Status allowed =
      transport_->authorize_ ? transport_->authorize_(*context) : absl::OkStatus();
  if (!allowed.ok()) transport_->refused_streams_.fetch_add(1, std::memory_order_relaxed);
  return new InboundStream(transport_, summary, allowed);
}

PeerTransport::PeerTransport(PeerTransportOptions options, Deliver deliver, Authorize authorize)
    : options_(std::move(options)),
      deliver_(std::move(deliver)),
      authorize_(std::move(authorize)) {}

PeerTransport::~PeerTransport() {
  std::map<std::string, std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&mu_);
    links.swap(links_);
  }
  links.clear();  // joins each sender, outside mu_
}

void PeerTransport::SetPeer(const std::string& node_id, const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node_id);
  if (it == links_.end()) {
    links_.emplace(node_id, std::make_shared<Link>(this, address));
  } else {
    it->second->SetAddress(address);
  }
}

void PeerTransport::RemovePeer(const std::string& node_id) {
  std::shared_ptr<Link> link;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(node_id);
    if (it == links_.end()) return;
    link = std::move(it->second);
    links_.erase(it);
  }
  link.reset();  // joins the sender, outside mu_
}

void PeerTransport::Send(const ReplicationMessage& message) {
  v1::ReplicationFrame frame = ToWire(message);
  std::shared_ptr<Link> link;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(message.to);
    if (it != links_.end()) link = it->second;
  }
  // Outside mu_: Enqueue may start a gRPC write, and sends to other peers need not wait for it.
  if (link == nullptr || !link->Enqueue(std::move(frame))) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

PeerTransport::Counters PeerTransport::counters() const {
  Counters c;
  c.sent = sent_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  c.received = received_.load(std::memory_order_relaxed);
  c.refused_frames = refused_frames_.load(std::memory_order_relaxed);
  c.refused_streams = refused_streams_.load(std::memory_order_relaxed);
  return c;
}

absl::Status PeerTransport::LastStreamStatus(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node_id);
  if (it == links_.end()) return absl::NotFoundError(absl::StrCat("no peer ", node_id));
  return it->second->last_status();
}

}  // namespace jobbroker::cluster
