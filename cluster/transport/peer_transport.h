#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/replication/messages.h"
#include "cluster/transport/replication.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace jobbroker::cluster {

struct PeerTransportOptions {
  std::string node_id;  // this node: the `to` every received frame must name
  // Sent on every outgoing stream as "authorization: Bearer <token>" (a token with the peer role
  // on the other nodes); empty: none (mTLS through `credentials`, or auth off).
  std::string peer_token;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure (loopback tests)
  // Messages queued for one peer beyond which new ones are dropped: the protocol resends what
  // is not answered, so a slow or paused peer costs memory up to here and no more.
  size_t max_queued_per_peer = 4096;
  // Between the end of a stream (peer down, refused, reset) and the next attempt.
  absl::Duration reconnect_delay = absl::Milliseconds(200);
  // The largest frame either side takes (a snapshot chunk of big jobs is the largest).
  int max_frame_bytes = 64 << 20;
  // gRPC keepalive of each outgoing stream's channel: a ping after `keepalive_time` without a
  // frame from the peer, the stream ended when it is unanswered for `keepalive_timeout`, and a
  // new one tried every reconnect_delay. A stream to a peer behind a link that drops packets
  // would otherwise hang on TCP's retransmissions, which back off to minutes apart: after the
  // link heals the peer would hear nothing for that long. Zero time: no pings.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(5);
};

// The replication messages between this node and its peers: one outgoing gRPC stream per peer
// (Replication.Stream, opened by a sender thread of that peer, which writes what Send queued),
// and the Replication service that receives the peers' streams and hands each message that
// decodes to `deliver`. Delivery is at most once and unordered across streams, which is all the
// protocol (cluster/replication/replica.h) assumes: a message lost with a broken stream or a
// full queue is counted and resent by the replica.
//
// Thread-safe. `deliver` runs on gRPC's threads and must return quickly (queue the message).
// The node's gRPC server that service() is registered on must be shut down before this object
// is destroyed.
class PeerTransport {
 public:
  using Deliver = std::function<void(ReplicationMessage)>;
  // Whether the caller of a stream may replicate to this node: OK, or the status the stream is
  // refused with (kUnauthenticated, kPermissionDenied). The node passes its token check for
  // the peer role; null: every caller may (auth off).
  using Authorize = std::function<absl::Status(const grpc::CallbackServerContext&)>;

  PeerTransport(PeerTransportOptions options, Deliver deliver, Authorize authorize);
  ~PeerTransport();  // stops every sender, cancelling a stream in progress
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;

  // The service to register on the node's gRPC server.
  grpc::Service* service() { return &service_; }

  // Where peer `node_id` listens (its gRPC address from etcd). A new address ends the stream to
  // the old one; the same address changes nothing.
  void SetPeer(const std::string& node_id, const std::string& address);
  void RemovePeer(const std::string& node_id);

  // Queues `message` for message.to. Dropped (and counted) if that peer is unknown or its queue
  // is full.
  void Send(const ReplicationMessage& message);

  struct Counters {
    uint64_t sent = 0;             // frames written to a stream
    uint64_t dropped = 0;          // never sent: unknown peer, full queue, broken stream
    uint64_t received = 0;         // frames delivered
    uint64_t refused_frames = 0;   // frames that ended their stream (INVALID_ARGUMENT)
    uint64_t refused_streams = 0;  // streams Authorize refused
  };
  Counters counters() const;
  // How the last stream to `node_id` ended (OK while none has ended; kNotFound for an unknown
  // peer): a refusal by the peer shows here.
  absl::Status LastStreamStatus(const std::string& node_id) const;

 private:
  class Link;
  class Receiver final : public v1::Replication::CallbackService {
   public:
    explicit Receiver(PeerTransport* transport) : transport_(transport) {}
    grpc::ServerReadReactor<v1::ReplicationFrame>* Stream(grpc::CallbackServerContext* context,
                                                          v1::StreamSummary* summary) override;

   private:
    PeerTransport* const transport_;
  };
  class InboundStream;

  const PeerTransportOptions options_;
  const Deliver deliver_;
  const Authorize authorize_;
  Receiver service_{this};

  mutable absl::Mutex mu_;
  // Shared so that Send can enqueue (and start a gRPC write) outside mu_ while RemovePeer runs;
  // the last owner's release stops the link's thread.
  std::map<std::string, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> refused_frames_{0};
  std::atomic<uint64_t> refused_streams_{0};
};

}  // namespace jobbroker::cluster
