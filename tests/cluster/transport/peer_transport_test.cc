// PeerTransport between two transports in one process, each behind a real gRPC server on a
// loopback port: messages both ways, refusals, a peer that goes away and comes back. Waits are
// for a condition with a generous deadline, never a measured time.

#include "cluster/transport/peer_transport.h"

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/transport/wire.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/frozen_link.h"

namespace jobbroker::cluster {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPatience = absl::Seconds(30);

// Waits until `done` holds or kPatience passes; returns whether it holds.
template <typename Predicate>
bool Eventually(Predicate done) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// One node's side: a PeerTransport whose received messages are kept, behind a gRPC server.
class Node {
 public:
  // `keepalive`: the transport's keepalive time and timeout both (zero: the defaults).
  explicit Node(std::string id, std::string peer_token = "", std::string required_token = "",
                int port = 0, absl::Duration keepalive = absl::ZeroDuration())
      : id_(id) {
    PeerTransportOptions options;
    options.node_id = id;
    options.peer_token = std::move(peer_token);
    options.reconnect_delay = absl::Milliseconds(20);
    if (keepalive > absl::ZeroDuration()) {
      options.keepalive_time = keepalive;
      options.keepalive_timeout = keepalive;
    }
    PeerTransport::Authorize authorize;
    if (!required_token.empty()) {
      authorize = [required = "Bearer " + required_token](const grpc::CallbackServerContext& c) {
        auto it = c.client_metadata().find("authorization");
        if (it == c.client_metadata().end()) {
          return absl::UnauthenticatedError("no peer token");
        }
        if (std::string(it->second.data(), it->second.size()) != required) {
          return absl::PermissionDeniedError("not a peer token");
        }
        return absl::OkStatus();
      };
    }
    transport_ = std::make_unique<PeerTransport>(
        options,
        [this](ReplicationMessage m) {
          absl::MutexLock lock(&mu_);
          received_.push_back(std::move(m));
        },
        std::move(authorize));
    Start(port);
  }
  ~Node() { Stop(); }

  void Start(int port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(transport_->service());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  PeerTransport& transport() { return *transport_; }
  size_t received_count() {
    absl::MutexLock lock(&mu_);
    return received_.size();
  }
  std::vector<ReplicationMessage> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  const std::string id_;
  absl::Mutex mu_;
  std::vector<ReplicationMessage> received_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeerTransport> transport_;
  std::unique_ptr<grpc::Server> server_;  // shut down before the transport goes
  int port_ = 0;
};

ReplicationMessage Append(const std::string& from, const std::string& to, uint64_t seq) {
  ReplicationMessage m;
  m.from = from;
  m.to = to;
  m.partition = 2;
  AppendRequest request{4, {seq - 1, 4}, {LogEntry{seq, 4, {}}}, seq - 1};
  request.entries[0].transition.delete_jobs = {absl::StrCat("job-", seq)};
  m.body = std::move(request);
  return m;
}

TEST(PeerTransportTest, MessagesFlowBothWaysInOrderOnEachStream) {
  Node a("a"), b("b");
  a.transport().SetPeer("b", b.address());
  b.transport().SetPeer("a", a.address());
  for (uint64_t seq = 1; seq <= 200; ++seq) a.transport().Send(Append("a", "b", seq));
  ReplicationMessage response;
  response.from = "b";
  response.to = "a";
  response.partition = 2;
  response.body = AppendResponse{4, AppendResponse::Result::kMatched, 200, 0};
  b.transport().Send(response);

  ASSERT_TRUE(Eventually([&] { return b.received_count() == 200 && a.received_count() == 1; }))
      << b.received_count() << " " << a.received_count();
  std::vector<ReplicationMessage> at_b = b.received();
  for (uint64_t i = 0; i < at_b.size(); ++i) {
    const auto* request = std::get_if<AppendRequest>(&at_b[i].body);
    ASSERT_NE(request, nullptr);
    EXPECT_EQ(at_b[i].from, "a");
    EXPECT_EQ(at_b[i].partition, 2u);
    ASSERT_EQ(request->entries.size(), 1u);
    EXPECT_EQ(request->entries[0].seq, i + 1);
    EXPECT_EQ(request->entries[0].transition.delete_jobs[0], absl::StrCat("job-", i + 1));
  }
  std::vector<ReplicationMessage> at_a = a.received();
  const auto* answer = std::get_if<AppendResponse>(&at_a[0].body);
  ASSERT_NE(answer, nullptr);
  EXPECT_EQ(answer->match_seq, 200u);
  EXPECT_EQ(a.transport().counters().sent, 200u);
  EXPECT_EQ(b.transport().counters().received, 200u);
  EXPECT_EQ(a.transport().counters().dropped, 0u);
}

// A link that goes silent (a firewall dropping packets, a frozen peer: nothing is reset) ends
// the stream on it once a keepalive ping goes unanswered, so the next stream is tried at once
// and carries on when the link is back, instead of waiting on TCP's retransmissions, which back
// off to minutes apart.
TEST(PeerTransportTest, AStreamOnALinkThatWentSilentEndsAndANewOneCarriesOn) {
  Node b("b");
  Node a("a", "", "", 0, absl::Seconds(1));
  absl::StatusOr<std::unique_ptr<testing::FrozenLink>> link =
      testing::FrozenLink::Start(b.address());
  ASSERT_TRUE(link.ok()) << link.status();
  a.transport().SetPeer("b", (*link)->address());
  a.transport().Send(Append("a", "b", 1));
  ASSERT_TRUE(Eventually([&] { return b.received_count() == 1; }));
  EXPECT_EQ((*link)->connections(), 1);

  (*link)->Freeze();
  EXPECT_TRUE(Eventually([&] {
    return a.transport().LastStreamStatus("b").code() == absl::StatusCode::kUnavailable;
  })) << "the stream on a silent link did not end: "
      << a.transport().LastStreamStatus("b");

  (*link)->Thaw();
  a.transport().Send(Append("a", "b", 2));
  ASSERT_TRUE(Eventually([&] { return b.received_count() == 2; }));
  EXPECT_GE((*link)->connections(), 2) << "the frame after the thaw came on the old connection";
}

TEST(PeerTransportTest, AStreamWithoutThePeerTokenIsRefusedAndDeliversNothing) {
  Node b("b", "", "peer-secret");
  Node wrong("a", "client-token");
  Node none("c");
  wrong.transport().SetPeer("b", b.address());
  none.transport().SetPeer("b", b.address());
  wrong.transport().Send(Append("a", "b", 1));
  none.transport().Send(Append("c", "b", 1));
  ASSERT_TRUE(Eventually([&] {
    return wrong.transport().LastStreamStatus("b").code() == absl::StatusCode::kPermissionDenied &&
           none.transport().LastStreamStatus("b").code() == absl::StatusCode::kUnauthenticated;
  })) << wrong.transport().LastStreamStatus("b")
      << " / " << none.transport().LastStreamStatus("b");
  EXPECT_GE(b.transport().counters().refused_streams, 2u);
  EXPECT_EQ(b.received_count(), 0u);

  // The right token gets through.
  Node right("d", "peer-secret");
  right.transport().SetPeer("b", b.address());
  right.transport().Send(Append("d", "b", 1));
  ASSERT_TRUE(Eventually([&] { return b.received_count() == 1; }));
  EXPECT_EQ(b.received()[0].from, "d");
}

TEST(PeerTransportTest, AFrameThatCannotBeTakenEndsItsStreamNamingTheField) {
  Node b("b");
  auto channel = grpc::CreateChannel(b.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Replication::NewStub(channel);
  struct Case {
    v1::ReplicationFrame frame;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({ToWire(Append("a", "c", 1)), "to: \"c\" is not this node"});
  v1::ReplicationFrame no_body = ToWire(Append("a", "b", 1));
  no_body.clear_body();
  cases.push_back({no_body, "body"});
  v1::ReplicationFrame bad_record = ToWire(Append("a", "b", 1));
  bad_record.mutable_append()->mutable_entries(0)->set_record("junk");
  cases.push_back({bad_record, "append.entries[0].record"});
  for (const Case& c : cases) {
    grpc::ClientContext context;
    v1::StreamSummary summary;
    auto writer = stub->Stream(&context, &summary);
    ASSERT_TRUE(writer->Write(ToWire(Append("a", "b", 7))));  // a good one first
    writer->Write(c.frame);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(status.error_message(), HasSubstr(c.field));
  }
  // Only the good frames were delivered.
  EXPECT_EQ(b.received_count(), cases.size());
  EXPECT_EQ(b.transport().counters().refused_frames, cases.size());
}

TEST(PeerTransportTest, MessagesReachAPeerAgainOnceItIsBack) {
  auto b = std::make_unique<Node>("b");
  const int port = b->port();
  Node a("a");
  a.transport().SetPeer("b", b->address());
  a.transport().Send(Append("a", "b", 1));
  ASSERT_TRUE(Eventually([&] { return b->received_count() == 1; }));

  b.reset();  // the peer is gone: what is sent now is dropped, never delivered twice
  for (uint64_t seq = 2; seq <= 20; ++seq) a.transport().Send(Append("a", "b", seq));
  ASSERT_TRUE(Eventually([&] { return a.transport().counters().dropped > 0; }));

  b = std::make_unique<Node>("b", "", "", port);  // back on the same address
  // The replica resends what is not answered; so does this test, until one arrives.
  uint64_t seq = 100;
  ASSERT_TRUE(Eventually([&] {
    a.transport().Send(Append("a", "b", ++seq));
    return b->received_count() > 0;
  }));
  for (const ReplicationMessage& m : b->received()) {
    const auto* request = std::get_if<AppendRequest>(&m.body);
    ASSERT_NE(request, nullptr);
    EXPECT_GE(request->entries[0].seq, 2u);
  }
}

TEST(PeerTransportTest, AnUnknownPeerOrAFullQueueDropsAndCounts) {
  Node a("a");
  a.transport().Send(Append("a", "nobody", 1));
  EXPECT_EQ(a.transport().counters().dropped, 1u);
  EXPECT_THAT(a.transport().LastStreamStatus("nobody"),
              ::testing::Property(&absl::Status::code, absl::StatusCode::kNotFound));

  // A peer where nothing listens: every frame is dropped, none is sent, none waits forever.
  Node gone("gone");
  const std::string address = gone.address();
  gone.Stop();
  a.transport().SetPeer("gone", address);
  for (uint64_t seq = 1; seq <= 50; ++seq) a.transport().Send(Append("a", "gone", seq));
  ASSERT_TRUE(Eventually([&] { return a.transport().counters().dropped == 51; }))
      << a.transport().counters().dropped;
  EXPECT_EQ(a.transport().counters().sent, 0u);
}

}  // namespace
}  // namespace jobbroker::cluster
