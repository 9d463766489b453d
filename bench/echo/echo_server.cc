// jobbroker-echo-server: a plain gRPC unary echo, the baseline for Broker.Enqueue.
//
//   jobbroker-echo-server [--listen HOST:PORT]   (default 127.0.0.1:7071; port 0 = any free)
//
// Prints "echo: serving grpc=ADDR" once it listens (the only way to learn a port-0 address),
// serves until SIGTERM or SIGINT, then exits 0.
//
// The server is built the way server/main.cc builds the broker's: callback API, the same
// maximum message size and streams per connection, health checking and reflection, gRPC's
// default threads and resource quota. What it leaves out is what jobbroker does per call:
// validation, the broker core, the RocksDB write and its fsync, and the RPC metrics
// interceptor. So the ratio Enqueue / Echo measured on one machine is jobbroker's own cost.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "jobbroker/bench/v1/echo.grpc.pb.h"

namespace jobbroker::bench {
namespace {

// Kept equal to server/main.cc's constants: a different HTTP/2 window or stream limit would
// make the baseline measure gRPC settings rather than jobbroker.
constexpr int kMaxMessageBytes = 64 << 20;
constexpr int kMaxConcurrentStreamsPerConnection = 1000;
constexpr absl::Duration kDrainTimeout = absl::Seconds(1);

constexpr char kUsage[] =
    "usage: jobbroker-echo-server [--listen HOST:PORT]\n"
    "  --listen HOST:PORT   gRPC address (default 127.0.0.1:7071; port 0 picks a free one)\n";

// Answers every call at once, on the gRPC thread that received it: no work of its own.
class EchoService final : public v1::Echo::CallbackService {
 public:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const v1::EchoMessage* req,
                                 v1::EchoMessage* resp) override {
    resp->set_payload(req->payload());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

int Run(int argc, char** argv) {
  std::string listen = "127.0.0.1:7071";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--listen=", 0) == 0) {
      listen = arg.substr(std::strlen("--listen="));
    } else if (arg == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else {
      std::fprintf(stderr, "jobbroker-echo-server: unexpected argument: %s\n%s", arg.c_str(),
                   kUsage);
      return 2;
    }
  }

  // Blocked before gRPC starts its threads, so they inherit the block and sigwait gets them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EchoService service;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreamsPerConnection);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "jobbroker-echo-server: --listen: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  const std::string address = absl::StrCat(listen.substr(0, listen.rfind(':') + 1), port);
  std::printf("echo: serving grpc=%s\n", address.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  server->Shutdown(absl::ToChronoTime(absl::Now() + kDrainTimeout));
  return 0;
}

}  // namespace
}  // namespace jobbroker::bench

int main(int argc, char** argv) { return jobbroker::bench::Run(argc, argv); }
