// jobbroker: the server binary. Wires the concrete parts together (the only place that names
// RocksDbStore and RealClock), serves until SIGTERM or SIGINT, then shuts down gracefully.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/broker.h"
#include "core/clock.h"
#include "core/validation.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "node/partitions.h"
#include "prometheus/registry.h"
#include "server/auth/auth_tokens.h"
#include "server/auth/authorizer.h"
#include "server/auth/tls.h"
#include "server/cluster/cluster_mode.h"
#include "server/config/config.h"
#include "server/config/flags.h"
#include "server/grpc/admin_service.h"
#include "server/grpc/broker_service.h"
#include "server/grpc/dependency_relay.h"
#include "server/grpc/forwarder.h"
#include "server/grpc/keepalive.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/rpc_metrics.h"
#include "server/http/admin_http_api.h"
#include "server/http/http_server.h"
#include "server/observability/log.h"
#include "server/observability/log_observer.h"
#include "server/observability/metrics.h"
#include "server/observability/metrics_observer.h"
#include "server/observability/process_metrics.h"
#include "server/observability/recovery_status.h"
#include "server/observability/storage_health.h"
#include "server/routing/router.h"
#include "server/stop_signals.h"
#include "server/ticker.h"
#include "storage/rocksdb_store.h"

namespace jobbroker::server {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;  // room for a batch of large payloads
// HTTP/2 streams (calls in flight) per client connection. gRPC's own default is unbounded; a
// client over the limit waits for a free stream rather than failing.
constexpr int kMaxConcurrentStreamsPerConnection = 1000;
// Replies are already computed when the drain starts; this bounds only their delivery.
constexpr absl::Duration kDrainTimeout = absl::Seconds(1);
// Cluster mode: how long SIGTERM waits for the node's partitions to move to other nodes before it
// stops anyway (Kubernetes' default grace period is 30 s; a hand-over takes a tick or two).
constexpr absl::Duration kHandOverTimeout = absl::Seconds(5);

// A start that fails prints one plain line, for the person at the terminal (and the tests);
// everything after the start is structured (server/observability/log.h).
int Fatal(const std::string& what) {
  std::cerr << "jobbroker: " << what << std::endl;
  return 1;
}

std::string WithPort(const std::string& address, int port) {
  return address.substr(0, address.rfind(':') + 1) + std::to_string(port);
}

int Run(int argc, char** argv) {
  // First, before gRPC starts threads of its own: every thread inherits the signals blocked.
  StopSignals& stop_signals = StopSignals::Install();
  // Debian builds Abseil with lock-order (deadlock) detection on, which keeps a graph of every
  // mutex and costs several percent of CPU on the hot paths. The unit and concurrency tests still
  // run with it (they do not come through here).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<ServerFlags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return Fatal(std::string(flags.status().message()) + "\n" + Usage());
  if (flags->help) {
    std::cout << Usage();
    return 0;
  }
  LogLevel log_level;
  LogFormat log_format;
  if (!ParseLogLevel(flags->log_level, &log_level))
    return Fatal("--log-level must be debug, info, warn or error");
  if (!ParseLogFormat(flags->log_format, &log_format))
    return Fatal("--log-format must be json or text");
  if (flags->metrics != "on" && flags->metrics != "off")
    return Fatal("--metrics must be on or off");
  const bool metrics_on = flags->metrics == "on";

  core::BrokerOptions options;
  options.max_hot_jobs = flags->max_hot_jobs;
  if (!flags->config.empty()) {
    absl::StatusOr<ServerPolicies> config = LoadServerConfig(flags->config);
    if (!config.ok()) return Fatal(std::string(config.status().message()));
    if (absl::Status s = core::ValidateStartPolicies(config->default_policy, config->queues);
        !s.ok())
      return Fatal(flags->config + ": " + std::string(s.message()));
    options.default_policy = config->default_policy;
    options.queue_policies = config->queues;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      GrpcServerCredentials({flags->tls_cert, flags->tls_key, flags->tls_client_ca});
  if (!credentials.ok()) return Fatal(std::string(credentials.status().message()));
  std::unique_ptr<Authorizer> authorizer;  // null: no --auth-tokens, every call allowed
  if (!flags->auth_tokens.empty()) {
    absl::StatusOr<std::vector<TokenEntry>> tokens = LoadAuthTokens(flags->auth_tokens);
    if (!tokens.ok()) return Fatal(std::string(tokens.status().message()));
    authorizer = std::make_unique<Authorizer>(*std::move(tokens));
  }
  const HttpTlsFiles http_tls{flags->http_tls_cert, flags->http_tls_key, flags->http_tls_client_ca};
  if (absl::Status s = CheckHttpTls(http_tls); !s.ok()) return Fatal(std::string(s.message()));
  if (flags->check_config) {
    std::cout << "jobbroker: config ok: "
              << (flags->config.empty() ? "built-in defaults" : flags->config) << " ("
              << options.queue_policies.size() << " queue policies), gRPC "
              << (flags->tls_cert.empty()        ? "without TLS"
                  : flags->tls_client_ca.empty() ? "over TLS"
                                                 : "over mutual TLS")
              << (authorizer == nullptr ? "" : " with bearer tokens") << ", HTTP "
              << (!http_tls.enabled()          ? "without TLS"
                  : http_tls.client_ca.empty() ? "over TLS"
                                               : "over mutual TLS")
              << std::endl;
    return 0;
  }
  Log::Configure(log_level, log_format);

  // HTTP first: liveness answers while recovery runs; readiness once it is done.
  prometheus::Registry registry;
  ProcessCollector process;
  RecoveryStatus recovery_status;  // before the server, which reads it until SetApi
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(flags->http_listen, {&registry, &process}, http_tls);
  if (!http.ok()) return Fatal(std::string(http.status().message()));
  // Until the API serves, the dashboard is told how far the recovery got.
  (*http)->SetStartingStatus([&recovery_status] { return recovery_status.Describe(); });

  std::error_code ec;
  std::filesystem::create_directories(flags->data_dir, ec);
  if (ec) return Fatal("--data-dir " + flags->data_dir + ": " + ec.message());
  Log::Write(LogLevel::kInfo, "starting", {{"data_dir", flags->data_dir}});
  absl::StatusOr<std::unique_ptr<storage::RocksDbStore>> store = storage::RocksDbStore::Open(
      flags->data_dir, {.partitions = static_cast<uint32_t>(flags->partitions)});
  if (!store.ok()) return Fatal("--data-dir: " + std::string(store.status().message()));
  const uint32_t partition_count = (*store)->partitions();
  if (const int from = (*store)->upgraded_from(); from != 0) {
    Log::Write(LogLevel::kInfo, "store_upgraded",
               {{"data_dir", flags->data_dir},
                {"from_format", absl::StrCat(from)},
                {"to_format", absl::StrCat(storage::kRocksDbStoreFormatVersion)}});
  }
  if (flags->partitions_given && partition_count != flags->partitions) {
    // Where each queue's records are follows from the count: the data dir's wins.
    Log::Write(LogLevel::kWarn, "partitions_kept",
               {{"data_dir", flags->data_dir},
                {"partitions", absl::StrCat(partition_count)},
                {"asked", absl::StrCat(flags->partitions)}});
  }

  core::RealClock clock;
  Ticker ticker;
  QueueLabels queue_labels(static_cast<size_t>(flags->metrics_max_queues));
  MetricsObserver metrics(registry, queue_labels);
  LogObserver log_observer;
  StorageHealth
      storage_health;  // readiness follows the store (server/observability/storage_health.h)
  std::vector<core::BrokerObserver*> observers = {&log_observer, &storage_health, &recovery_status};
  if (metrics_on) observers.push_back(&metrics);
  core::TeeObserver observer(observers);
  options.commit_mode = core::CommitPipeline::Mode::kBackground;
  options.wake = [&ticker] { ticker.Wake(); };
  options.observer = &observer;
  // Cluster mode: each partition's broker writes through its replica, and starts halted until
  // this node leads it; its retries (every 200 ms here) rebuild it once it does.
  std::unique_ptr<ClusterMode> cluster;
  if (!flags->cluster_etcd.empty()) {
    // Until etcd answers and the node has joined, that is what the start waits for.
    (*http)->SetStartingStatus([etcd = flags->cluster_etcd] {
      return absl::StrCat("joining the cluster through etcd at ", etcd);
    });
    absl::StatusOr<std::unique_ptr<ClusterMode>> started =
        ClusterMode::Start(*flags, **store, clock, authorizer.get());
    if (!started.ok()) return Fatal(std::string(started.status().message()));
    cluster = *std::move(started);
    (*http)->SetStartingStatus([&recovery_status] { return recovery_status.Describe(); });
    options.store_retry_interval = absl::Milliseconds(200);
  }
  absl::StatusOr<std::unique_ptr<node::Partitions>> broker =
      cluster != nullptr ? node::Partitions::Open(cluster->stores(), clock, options)
                         : node::Partitions::Open(**store, clock, partition_count, options);
  if (!broker.ok()) {
    std::string where = flags->config.empty() ? "" : flags->config + ": ";
    return Fatal(where + std::string(broker.status().message()));
  }
  ticker.Start(**broker);

  RpcAuth auth(authorizer.get(), **broker);
  WorkStreamLimit work_streams(flags->max_work_streams);
  RpcMetrics rpc_metrics(metrics_on ? &registry : nullptr);
  // Which node answers each call; in cluster mode the others' calls are forwarded to them.
  const std::string node_id = flags->node_id.empty() ? "local" : flags->node_id;
  std::unique_ptr<Router> router =
      cluster != nullptr
          ? Router::Cluster(flags->cluster_name, node_id, partition_count, cluster->served_check())
          : Router::SingleNode(node_id, partition_count);
  std::unique_ptr<Forwarder> forwarder;
  const Keepalive keepalive{.time = absl::Seconds(flags->keepalive_time),
                            .timeout = absl::Seconds(flags->keepalive_timeout)};
  if (cluster != nullptr) forwarder = std::make_unique<Forwarder>(node_id, nullptr, keepalive);
  BrokerService broker_service(**broker, auth, work_streams, rpc_metrics, *router, forwarder.get());
  AdminService admin_service(**broker, auth, rpc_metrics, *router, forwarder.get());
  // Dependencies on other partitions' jobs: watched where they live, their outcomes delivered.
  DependencyRelay dependency_relay(**broker, *router, forwarder.get(),
                                   cluster != nullptr ? cluster->peer_token() : "");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(flags->listen, *credentials, &grpc_port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreamsPerConnection);
  ApplyServerKeepalive(keepalive, builder);
  builder.RegisterService(&broker_service);
  builder.RegisterService(&admin_service);
  if (cluster != nullptr) builder.RegisterService(cluster->peer_service());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0)
    return Fatal("--listen: cannot listen on " + flags->listen);
  // It may answer calls from here on: a signal now is a graceful stop, once the start is done.
  stop_signals.Serving();
  // The dashboard's API calls the Admin service in process: one implementation of every check.
  AdminHttpApi admin_http(server->InProcessChannel(grpc::ChannelArguments()));

  BrokerCollector collector(**broker, queue_labels);
  storage::RocksDbStore& rocks = **store;
  FunctionGauges storage({
      {"jobbroker_rocksdb_live_data_bytes", "RocksDB's estimate of live data, in bytes.",
       [&rocks] { return static_cast<double>(rocks.LiveDataBytes()); }},
      {"jobbroker_rocksdb_pending_compaction_bytes",
       "Bytes RocksDB estimates compaction still has to rewrite; growing = compaction lags.",
       [&rocks] { return static_cast<double>(rocks.PendingCompactionBytes()); }},
  });
  FunctionGauges streams({
      {"jobbroker_work_streams_open",
       "Work streams open on this node (a relayed stream's upstream from another node counts).",
       [&work_streams] { return static_cast<double>(work_streams.open()); }},
      {"jobbroker_work_streams_relaying",
       "Work streams this node relays to other leaders: their workers are not connected to "
       "their queues' leaders, and every message takes one more hop.",
       [&work_streams] { return static_cast<double>(work_streams.relaying()); }},
      {"jobbroker_work_given_back_total",
       "Jobs pushed on a Work stream that its worker never received (it went away first), given "
       "back at once: READY again, the attempt not counted.",
       [&work_streams] { return static_cast<double>(work_streams.given_back()); },
       prometheus::MetricType::Counter},
      {"jobbroker_enqueue_streams_open",
       "EnqueueStreams open on this node: producers that send their batches on a stream.",
       [&broker_service] { return static_cast<double>(broker_service.enqueue_streams_open()); }},
  });
  (*http)->AddCollectable(&collector);
  (*http)->AddCollectable(&storage);
  (*http)->AddCollectable(&streams);
  if (cluster != nullptr) {
    // Per partition: leader, epoch, in-sync set, followers' lag; and the commit-wait histogram.
    if (prometheus::Collectable* gauges = cluster->AttachMetrics(registry, *router))
      (*http)->AddCollectable(gauges);
  }
  (*http)->SetApi(&admin_http);
  (*http)->SetReady(true);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  // A cluster node is ready while it serves RPCs: its partitions' writability follows their
  // leadership, not this node's disk (per-partition status is the cluster's to report).
  if (cluster == nullptr) {
    storage_health.Attach([&http, health](bool writable) {
      (*http)->SetReady(writable);
      health->SetServingStatus(v1::Broker::service_full_name(), writable);
    });
  } else {
    // The same probe works for both modes (a Kubernetes readiness probe names the service).
    health->SetServingStatus(v1::Broker::service_full_name(), true);
  }

  const std::string grpc_address = WithPort(flags->listen, grpc_port);
  if (cluster != nullptr) {
    if (absl::Status s = cluster->Attach(**broker, grpc_address, *router); !s.ok())
      return Fatal("cluster mode: " + std::string(s.message()));
  } else {
    router->Publish(SingleNodeView(node_id, grpc_address, partition_count));
  }
  const std::string http_address = WithPort(flags->http_listen, (*http)->port());
  Log::Write(LogLevel::kInfo, "serving",
             {{"grpc", grpc_address},
              {"http", http_address},
              {"partitions", absl::StrCat(partition_count)}});
  dependency_relay.Start();
  std::printf("jobbroker: serving grpc=%s http=%s\n", grpc_address.c_str(), http_address.c_str());
  std::fflush(stdout);

  const int sig = stop_signals.Await();
  Log::Write(LogLevel::kInfo, "shutting_down", {{"signal", absl::StrCat(sig)}});
  if (cluster != nullptr) {
    // Leadership first, while this node still serves (forwarding to the new leaders) and still
    // acknowledges as a follower: the partitions it led move in a tick instead of a lease TTL.
    const absl::Time started = absl::Now();
    absl::Status handed = cluster->HandOver(kHandOverTimeout);
    Log::Write(handed.ok() ? LogLevel::kInfo : LogLevel::kWarn, "handed_over",
               {{"took_ms", absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - started))},
                {"reason", std::string(handed.message())}});
  }

  // Stop leasing and answer long polls, let in-flight RPCs finish, flush, exit 0.
  (*http)->SetServing(false);
  server->GetHealthCheckService()->SetServingStatus(false);
  dependency_relay.Stop();
  (*broker)->Shutdown();  // from here every change is refused with UNAVAILABLE
  // Every change accepted before is durable after this, and its reply has been handed to gRPC.
  absl::Status flushed = (*broker)->Flush();
  // civetweb takes up to a second to notice its stop; let it do so while gRPC drains.
  std::thread http_stop([&http] { http->reset(); });
  // The drain only has to deliver replies; idle client connections must not hold it up.
  server->Shutdown(absl::ToChronoTime(absl::Now() + kDrainTimeout));
  ticker.Stop();
  http_stop.join();
  if (cluster != nullptr) cluster->Stop();  // gives up its leadership: others take over now
  broker->reset();
  cluster.reset();
  store->reset();
  if (!flushed.ok()) {
    Log::Write(LogLevel::kError, "flush_failed", {{"reason", std::string(flushed.message())}});
    return 1;
  }
  Log::Write(LogLevel::kInfo, "stopped");
  return 0;
}

}  // namespace
}  // namespace jobbroker::server

int main(int argc, char** argv) { return jobbroker::server::Run(argc, argv); }
